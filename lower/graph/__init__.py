"""The graph stage: a ClosedJaxpr in, a Graph (graph_ir) out, every pass Graph -> Graph.

canonicalize interprets the jaxpr, one rule per primitive, into the graph IR's few
accelerator-meaningful ops, folding constants on the host as it goes (fold); the passes drop dead
code, sink reshapes, fuse elementwise chains and epilogues into the producing conv/matmul and fold
batch norms into weights (passes); for int8, calibrate measures every value's range by running the
graph's reference semantics (evaluate) and quantize rewrites the graph with integer CONV/MATMUL and
REQUANT records (requant).  Nothing here knows the hardware: the schedule stage takes the Graph on.
"""
