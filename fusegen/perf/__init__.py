"""fusegen.perf: a static cost model of NKI kernels: instruction costs, a trace schedule, the roofline."""
