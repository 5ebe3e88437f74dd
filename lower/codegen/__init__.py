"""The codegen stage: a Graph, its Layout and its Schedule in; a Program out.

lowering plans DRAM by tensor liveness (memory) and runs one rule per op kind, each emitting
through the Emitter (emitter: the instruction list, the constant blob, local allocation of exactly
the buffers the schedule stage's nest lists): convs and matmuls on the matrix unit (matrix),
depthwise convs and pooling one vector op per window tap (window), elementwise chains, reductions,
gathers and copies on the vector unit (vector), an expression over one local tile, for elementwise
nodes and fused epilogues alike (tile_expr); tokens then orders the queues with the fewest
dependency tokens.  Conv-shaped nests take their tilings from the Schedule; vector ops ask the
schedule stage's mapper (map_vector) for theirs as they are emitted.
"""
