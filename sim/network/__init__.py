"""Flow-level network model and collectives (work in progress; the API below is the contract).

Public API::

    from sim.engine import Engine
    from sim.network import Topology, Network, load_config, preset_names
    topo = Topology.from_preset("zionex")            # or Topology.from_config(dict / TOML path)
    topo.num_gpus, topo.nodes, topo.gpus_per_node, topo.host_endpoint(node)
    eng = Engine(); net = Network(eng, topo)
    f = net.start_flow(src, dst, nbytes, on_done=cb, tag="x")   # cb(flow) at arrival; f.finish_ps
    g = net.start_flows(srcs, dsts, nbytes_array, on_done=cb)   # one group, vectorised
    net.link_bytes (np.ndarray per link), net.link_class_bytes() -> {"nvlink": .., "nic": ..}

    from sim.network import collectives as coll
    h = coll.alltoallv(net, ranks, sizes_matrix, algorithm="direct" | "hierarchical", on_done=cb)
    h = coll.allreduce(net, ranks, nbytes, algorithm="ring" | "double_binary_tree" | "hierarchical",
                       chunks=1, on_done=cb)
    h = coll.reduce_scatter(net, ranks, nbytes, ...); h = coll.all_gather(net, ranks, nbytes, ...)
    eng.run(); h.end_ps, h.time_ps, h.link_bytes, h.link_class_bytes()

    # closed-form (alpha-beta) estimates without running the engine, for planners:
    sim.network.estimate_alltoallv_time_s(topology, sizes_matrix, algorithm="direct")
    sim.network.estimate_allreduce_time_s(topology, nbytes, ranks, algorithm="ring")
    sim.network.estimate_reduce_scatter_time_s / estimate_all_gather_time_s (same arguments)

Endpoints are global GPU ranks ``node * gpus_per_node + local``; host (CPU memory) endpoints are
``topo.host_endpoint(node)``. Times are integer picoseconds on the shared engine.
"""
