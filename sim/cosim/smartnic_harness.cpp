// Native co-simulation harness of the SmartNIC top (rtl/smartnic.py) under Verilator.
//
// Built by neonic.sim.cosim.native into a shared library beside the Verilated model and driven
// from Python through ctypes, one call per NIC and phase (a transaction batch), never per cycle:
// the stream drivers, the two memory models (the cache's back port and the receive memory) and
// the frame/completion sinks run here, cycle by cycle, next to the model. Python packs the
// stimulus before the call and decodes what comes back after it; its scoreboards are unchanged.
//
// The memory model follows sim/harness/memory.py (MemoryCore) cycle for cycle: outputs decided
// at the start of a cycle, transfers taken at the clock edge; a read accepted at the edge ending
// cycle c with latency L presents its first beat in cycle c + L at the earliest, not before the
// previous read's last beat; responses in order, back to back; reads capture their data once
// every earlier write has arrived; at most max_outstanding requests in flight. Contract
// violations (zero beats, out of range, a wrong `last` on write data) stop the run with a
// message, as the Python model raises MemoryModelError.
//
// The stream sources follow sim/cosim/runners.py (amaranth_phase): a payload, once offered,
// stays valid until taken; with probability `idle` a source offers nothing in a cycle; a sink
// is not ready with probability `backpressure`. Sources of group 1 are sent first (all of them
// concurrently), then group 2 while the sink collects, until every source is sent and the sink
// has seen `stop_count` packets (beats with `last`) or items; then 4 more cycles and the
// counters are read.
//
// VTOP (the Verilated class, e.g. Vsmartnic) is given on the compiler's command line.

#include <chrono>
#include <ctime>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <vector>

#include "verilated.h"
#define STR2(x) #x
#define STR(x) STR2(x)
#include STR(VTOP.h)

namespace {

// ---- port access (Verilator maps widths to CData/SData/IData/QData or VlWide<N>) ---------
template <class T>
inline void put(T& port, const uint32_t* w, int nwords) {
    uint64_t v = w[0];
    if (sizeof(T) > 4 && nwords > 1) v |= static_cast<uint64_t>(w[1]) << 32;
    port = static_cast<T>(v);
}
template <std::size_t N>
inline void put(VlWide<N>& port, const uint32_t* w, int nwords) {
    for (std::size_t i = 0; i < N; ++i) port[i] = i < static_cast<std::size_t>(nwords) ? w[i] : 0;
}
template <class T>
inline void zero(T& port) { port = 0; }
template <std::size_t N>
inline void zero(VlWide<N>& port) { for (std::size_t i = 0; i < N; ++i) port[i] = 0; }
template <class T>
inline void get(const T& port, uint32_t* w, int nwords) {
    uint64_t v = port;
    w[0] = static_cast<uint32_t>(v);
    if (nwords > 1) w[1] = static_cast<uint32_t>(v >> 32);
    for (int i = 2; i < nwords; ++i) w[i] = 0;
}
template <std::size_t N>
inline void get(const VlWide<N>& port, uint32_t* w, int nwords) {
    for (int i = 0; i < nwords; ++i) w[i] = static_cast<std::size_t>(i) < N ? port[i] : 0;
}
template <class T> constexpr int words_of(const T&) { return sizeof(T) > 4 ? 2 : 1; }
template <std::size_t N> constexpr int words_of(const VlWide<N>&) { return static_cast<int>(N); }

inline uint64_t bits(const uint32_t* w, int off, int width) {
    uint64_t v = 0;
    for (int i = 0; i < width; ++i) {
        int b = off + i;
        v |= static_cast<uint64_t>((w[b >> 5] >> (b & 31)) & 1u) << i;
    }
    return v;
}
inline void set_bit(uint32_t* w, int b, int value) {
    if (value) w[b >> 5] |= 1u << (b & 31); else w[b >> 5] &= ~(1u << (b & 31));
}

struct Rng {  // xorshift64*
    uint64_t s;
    explicit Rng(uint64_t seed) : s(seed ? seed : 0x9E3779B97F4A7C15ull) {}
    uint64_t next() { s ^= s >> 12; s ^= s << 25; s ^= s >> 27; return s * 0x2545F4914F6CDD1Dull; }
    double uniform() { return (next() >> 11) * (1.0 / 9007199254740992.0); }
    int range(int lo, int hi) { return lo + static_cast<int>(next() % static_cast<uint64_t>(hi - lo + 1)); }
};

// ---- memory model --------------------------------------------------------------------------
struct MemLayout {  // bit offsets/widths of the request and write-beat payloads
    int addr_off, addr_w, beats_off, beats_w, write_off, mask_off, wlast_off;
};

struct Memory {
    struct Read { uint64_t addr; int beats; int64_t ready; int64_t writes_before; bool captured;
                  std::vector<uint8_t> data; int sent; };
    struct Write { uint64_t addr; int beats; int done; };
    struct WBeat { std::vector<uint8_t> data; std::vector<uint8_t> enable; int last; };

    uint8_t* contents = nullptr;
    uint64_t beats_total = 0;
    int W = 0, lat_lo = 1, lat_hi = 1, max_out = 16;
    MemLayout lay{};
    std::deque<Read> reads;
    std::deque<Write> writes;
    std::deque<WBeat> wbuf;
    int64_t writes_accepted = 0, writes_completed = 0, cycle = 0;
    bool offered = false;
    int req_ready = 0, wdata_ready = 0, resp_valid = 0, resp_last = 0;
    const uint8_t* resp_data = nullptr;
    char* error = nullptr;  // set on a contract violation (points into the phase's message)

    size_t outstanding() const { return reads.size() + writes.size(); }

    void drive() {
        req_ready = outstanding() < static_cast<size_t>(max_out);
        wdata_ready = 1;
        resp_valid = 0;
        resp_last = 0;
        if (!reads.empty()) {
            Read& h = reads.front();
            if (h.captured && cycle >= h.ready) {
                resp_valid = 1;
                resp_data = h.data.data() + static_cast<size_t>(h.sent) * W;
                resp_last = h.sent == h.beats - 1;
            }
        }
        offered = resp_valid;
    }

    void capture(Read& r) {
        r.data.assign(contents + r.addr * W, contents + (r.addr + r.beats) * W);
        r.captured = true;
    }

    bool fail(char* msg, const char* what) {
        if (msg) std::snprintf(msg, 256, "%s", what);
        return false;
    }

    // the transfers of this cycle; returns false on a contract violation (message in msg)
    bool edge(int req_valid, const uint32_t* req, int wvalid, const uint32_t* wdata,
              int resp_ready, char* msg) {
        if (resp_valid && resp_ready) {
            Read& h = reads.front();
            offered = false;
            if (++h.sent == h.beats) reads.pop_front();
        }
        if (wvalid && wdata_ready) {
            WBeat b;
            b.data.resize(W);
            std::memcpy(b.data.data(), wdata, W);
            b.enable.resize(W);
            for (int i = 0; i < W; ++i) b.enable[i] = static_cast<uint8_t>(bits(wdata, lay.mask_off + i, 1));
            b.last = static_cast<int>(bits(wdata, lay.wlast_off, 1));
            wbuf.push_back(std::move(b));
        }
        if (req_valid && req_ready) {
            uint64_t addr = bits(req, lay.addr_off, lay.addr_w);
            int beats = static_cast<int>(bits(req, lay.beats_off, lay.beats_w));
            bool write = lay.write_off >= 0 && bits(req, lay.write_off, 1);
            char text[256];
            if (beats < 1) {
                std::snprintf(text, sizeof text, "%s request at beat address %#llx with beats=0 "
                              "(the port requires beats >= 1)", write ? "write" : "read",
                              static_cast<unsigned long long>(addr));
                return fail(msg, text);
            }
            if (addr + beats > beats_total) {
                std::snprintf(text, sizeof text, "%s request out of range: beat address %#llx + "
                              "%d beat(s) exceeds the memory's %llu beats of %d bytes",
                              write ? "write" : "read", static_cast<unsigned long long>(addr),
                              beats, static_cast<unsigned long long>(beats_total), W);
                return fail(msg, text);
            }
            if (write) {
                writes.push_back({addr, beats, 0});
                ++writes_accepted;
            } else {
                int lat = lat_lo == lat_hi ? lat_lo : rng->range(lat_lo, lat_hi);
                reads.push_back({addr, beats, cycle + lat, writes_accepted, false, {}, 0});
                if (reads.back().writes_before <= writes_completed) capture(reads.back());
            }
        }
        while (!writes.empty() && !wbuf.empty()) {
            Write& wr = writes.front();
            WBeat b = std::move(wbuf.front());
            wbuf.pop_front();
            int expect_last = wr.done == wr.beats - 1;
            if (b.last != expect_last) {
                char text[256];
                std::snprintf(text, sizeof text, "write data beat %d of %d for beat address %#llx "
                              "has last=%d, expected last=%d", wr.done, wr.beats,
                              static_cast<unsigned long long>(wr.addr), b.last, expect_last);
                return fail(msg, text);
            }
            uint8_t* dst = contents + (wr.addr + wr.done) * W;
            for (int i = 0; i < W; ++i)
                if (b.enable[i]) dst[i] = b.data[i];
            if (++wr.done == wr.beats) {
                writes.pop_front();
                ++writes_completed;
                for (Read& r : reads)
                    if (!r.captured && r.writes_before <= writes_completed) capture(r);
            }
        }
        ++cycle;
        return true;
    }

    bool idle() const { return reads.empty() && writes.empty() && wbuf.empty(); }
    Rng* rng = nullptr;
};

}  // namespace

// ---- the C interface -------------------------------------------------------------------------
extern "C" {

enum { SRC_CACHE_CMD, SRC_DESC, SRC_DEST, SRC_SEND, SRC_BAGS, SRC_QP_INIT, SRC_RX_FRAME, NSRC };
enum { SINK_TX_FRAME, SINK_COMPLETION };

struct NicConfig {
    int32_t data_bytes;
    MemLayout mem, rx_mem;
    int32_t mem_lat_lo, mem_lat_hi, mem_max_out;
    int32_t rx_lat_lo, rx_lat_hi, rx_max_out;
    int32_t frame_last_off;  // bit of `last` in the tx_frame payload
};

struct Phase {
    uint64_t mac;
    uint32_t ip;
    uint64_t seed;
    double idle, backpressure;
    const uint32_t* src_words[NSRC];
    int64_t src_n[NSRC];
    int32_t src_stride[NSRC];
    int32_t src_group[NSRC];   // 0: unused, 1: sent first, 2: sent while the sink collects
    int32_t sink;              // SINK_TX_FRAME (count packets) or SINK_COMPLETION (count items)
    int64_t stop_count;
    uint32_t* sink_words;
    int64_t sink_cap;
    int32_t sink_stride;
    int64_t budget;            // cycles before the run is abandoned
    // results
    int64_t sink_n;
    int64_t cycles;
    double loop_s;             // wall time of the loop
    double loop_cpu_s;         // CPU time of this thread in the loop
    int32_t status;            // 0 ok, 1 cycle budget exhausted, 2 memory contract, 3 sink full
    uint32_t counters[64];
    char message[256];
};

struct Nic {
    VerilatedContext ctx;
    VTOP* top;
    NicConfig cfg;
    Memory mem, rxm;
    Rng rng{1};
    int64_t total_cycles = 0;
};

void* nic_new(const NicConfig* cfg, uint8_t* mem, uint64_t mem_len, uint8_t* rx_mem,
              uint64_t rx_len) {
    Nic* n = new Nic();
    n->top = new VTOP(&n->ctx, "top");
    n->cfg = *cfg;
    int W = cfg->data_bytes;
    Memory* ms[2] = {&n->mem, &n->rxm};
    for (int k = 0; k < 2; ++k) {
        Memory& m = *ms[k];
        m.contents = k ? rx_mem : mem;
        m.beats_total = (k ? rx_len : mem_len) / W;
        m.W = W;
        m.lay = k ? cfg->rx_mem : cfg->mem;
        m.lat_lo = k ? cfg->rx_lat_lo : cfg->mem_lat_lo;
        m.lat_hi = k ? cfg->rx_lat_hi : cfg->mem_lat_hi;
        m.max_out = k ? cfg->rx_max_out : cfg->mem_max_out;
        m.rng = &n->rng;
    }
    n->top->clk = 0;
    n->top->rst = 1;
    n->top->eval();
    return n;
}

void nic_free(void* h) {
    Nic* n = static_cast<Nic*>(h);
    n->top->final();
    delete n->top;
    delete n;
}

int nic_memories_idle(void* h) {
    Nic* n = static_cast<Nic*>(h);
    return n->mem.idle() && n->rxm.idle();
}

int64_t nic_total_cycles(void* h) { return static_cast<Nic*>(h)->total_cycles; }

int nic_run(void* h, Phase* p) {
    Nic* n = static_cast<Nic*>(h);
    VTOP* t = n->top;
    const int W = n->cfg.data_bytes;
    n->rng = Rng(p->seed * 0x9E3779B97F4A7C15ull + 1);
    p->status = 0;
    p->sink_n = 0;
    p->message[0] = 0;
    int64_t pos[NSRC] = {0};
    bool offered[NSRC] = {false};
    int64_t packets = 0;
    int64_t cycles = 0;
    // payload scratch: up to 2048 data bits (data_bytes <= 256) plus the other fields
    uint32_t rq[8], wd[80], rrq[8], rwd[80], sinkbuf[80], resp[80];

    auto thread_cpu = [] {
        timespec ts;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
        return ts.tv_sec + 1e-9 * ts.tv_nsec;
    };
    auto t0 = std::chrono::steady_clock::now();
    double c0 = thread_cpu();

    // One clock cycle: harness outputs, settle, sample, edge, take the transfers.
    // `stage`: 0 reset, 1 group 1, 2 group 2 + sink, 3 drain (nothing offered, sink not ready).
    auto cycle = [&](int stage, int rst) -> bool {
        t->rst = rst;
        n->mem.drive();
        n->rxm.drive();
        // memory responses
        std::memset(resp, 0, sizeof resp);
        if (n->mem.resp_valid) {
            std::memcpy(resp, n->mem.resp_data, W);
            set_bit(resp, W * 8, n->mem.resp_last);
        }
        put(t->mem___05Fresp___05Fpayload, resp, words_of(t->mem___05Fresp___05Fpayload));
        t->mem___05Fresp___05Fvalid = n->mem.resp_valid;
        t->mem___05Freq___05Fready = n->mem.req_ready;
        t->mem___05Fwdata___05Fready = n->mem.wdata_ready;
        std::memset(resp, 0, sizeof resp);
        if (n->rxm.resp_valid) {
            std::memcpy(resp, n->rxm.resp_data, W);
            set_bit(resp, W * 8, n->rxm.resp_last);
        }
        put(t->rx_mem___05Fresp___05Fpayload, resp, words_of(t->rx_mem___05Fresp___05Fpayload));
        t->rx_mem___05Fresp___05Fvalid = n->rxm.resp_valid;
        t->rx_mem___05Freq___05Fready = n->rxm.req_ready;
        t->rx_mem___05Fwdata___05Fready = n->rxm.wdata_ready;
        // sources
#define SOURCE(k, port)                                                                        \
        if (!offered[k] && !rst && p->src_group[k] == stage && pos[k] < p->src_n[k] &&          \
            !(p->idle > 0 && n->rng.uniform() < p->idle)) {                                      \
            put(t->port##___05Fpayload, p->src_words[k] + pos[k] * p->src_stride[k],              \
                p->src_stride[k]);                                                               \
            offered[k] = true;                                                                   \
        }                                                                                        \
        t->port##___05Fvalid = offered[k];
        SOURCE(SRC_CACHE_CMD, cache_cmd)
        SOURCE(SRC_DESC, desc)
        SOURCE(SRC_DEST, dest)
        SOURCE(SRC_SEND, send)
        SOURCE(SRC_BAGS, bags)
        SOURCE(SRC_QP_INIT, qp_init)
        SOURCE(SRC_RX_FRAME, rx_frame)
#undef SOURCE
        int sink_ready = stage == 2 && !(p->backpressure > 0 && n->rng.uniform() < p->backpressure);
        t->tx_frame___05Fready = p->sink == SINK_TX_FRAME ? sink_ready : 0;
        t->completion___05Fready = p->sink == SINK_COMPLETION ? sink_ready : 0;
        t->clk = 0;
        t->eval();
        // sample what the design drives just before the edge
        bool fired[NSRC];
        fired[SRC_CACHE_CMD] = offered[SRC_CACHE_CMD] && t->cache_cmd___05Fready;
        fired[SRC_DESC] = offered[SRC_DESC] && t->desc___05Fready;
        fired[SRC_DEST] = offered[SRC_DEST] && t->dest___05Fready;
        fired[SRC_SEND] = offered[SRC_SEND] && t->send___05Fready;
        fired[SRC_BAGS] = offered[SRC_BAGS] && t->bags___05Fready;
        fired[SRC_QP_INIT] = offered[SRC_QP_INIT] && t->qp_init___05Fready;
        fired[SRC_RX_FRAME] = offered[SRC_RX_FRAME] && t->rx_frame___05Fready;
        int mreq_v = t->mem___05Freq___05Fvalid, mw_v = t->mem___05Fwdata___05Fvalid;
        int mresp_r = t->mem___05Fresp___05Fready;
        get(t->mem___05Freq___05Fpayload, rq, words_of(t->mem___05Freq___05Fpayload));
        get(t->mem___05Fwdata___05Fpayload, wd, words_of(t->mem___05Fwdata___05Fpayload));
        int rreq_v = t->rx_mem___05Freq___05Fvalid, rw_v = t->rx_mem___05Fwdata___05Fvalid;
        int rresp_r = t->rx_mem___05Fresp___05Fready;
        get(t->rx_mem___05Freq___05Fpayload, rrq, words_of(t->rx_mem___05Freq___05Fpayload));
        get(t->rx_mem___05Fwdata___05Fpayload, rwd, words_of(t->rx_mem___05Fwdata___05Fpayload));
        int took = 0;
        if (p->sink == SINK_TX_FRAME && t->tx_frame___05Fvalid && t->tx_frame___05Fready) {
            get(t->tx_frame___05Fpayload, sinkbuf, p->sink_stride);
            took = 1;
            if (bits(sinkbuf, n->cfg.frame_last_off, 1)) ++packets;
        } else if (p->sink == SINK_COMPLETION && t->completion___05Fvalid &&
                   t->completion___05Fready) {
            get(t->completion___05Fpayload, sinkbuf, p->sink_stride);
            took = 1;
            ++packets;
        }
        t->clk = 1;
        t->eval();
        ++cycles;
        for (int k = 0; k < NSRC; ++k)
            if (fired[k]) { ++pos[k]; offered[k] = false; }
        if (took) {
            if (p->sink_n >= p->sink_cap) {
                p->status = 3;
                std::snprintf(p->message, sizeof p->message, "sink overflow: more than %lld beats",
                              static_cast<long long>(p->sink_cap));
                return false;
            }
            std::memcpy(p->sink_words + p->sink_n * p->sink_stride, sinkbuf, 4 * p->sink_stride);
            ++p->sink_n;
        }
        if (!n->mem.edge(mreq_v, rq, mw_v, wd, mresp_r, p->message) ||
            !n->rxm.edge(rreq_v, rrq, rw_v, rwd, rresp_r, p->message)) {
            p->status = 2;
            return false;
        }
        return true;
    };

    bool ok = true;
    t->local_mac = p->mac;
    t->local_ip = p->ip;
    ok = cycle(0, 1);                      // reset (one cycle, as the Python runners do)
    auto sent = [&](int group) {
        for (int k = 0; k < NSRC; ++k)
            if (p->src_group[k] == group && pos[k] < p->src_n[k]) return false;
        return true;
    };
    while (ok && !sent(1)) {
        if (cycles >= p->budget) { p->status = 1; ok = false; break; }
        ok = cycle(1, 0);
    }
    while (ok && !(sent(2) && packets >= p->stop_count)) {
        if (cycles >= p->budget) { p->status = 1; ok = false; break; }
        ok = cycle(2, 0);
    }
    for (int i = 0; ok && i < 4; ++i) ok = cycle(3, 0);
    if (p->status == 1)
        std::snprintf(p->message, sizeof p->message, "no progress within %lld cycles: %lld of %lld "
                      "sink packets", static_cast<long long>(p->budget),
                      static_cast<long long>(packets), static_cast<long long>(p->stop_count));
    get(t->counters, p->counters, words_of(t->counters) < 64 ? words_of(t->counters) : 64);
    p->cycles = cycles;
    n->total_cycles += cycles;
    p->loop_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    p->loop_cpu_s = thread_cpu() - c0;
    return p->status;
}

}  // extern "C"
