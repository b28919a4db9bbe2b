"""Golden reference models: what each unit computes, in numpy, written from the semantics
(torch/FBGEMM EmbeddingBag, the cache policy, RoCEv2 framing), never from the RTL."""
