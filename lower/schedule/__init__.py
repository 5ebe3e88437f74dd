"""The schedule stage: a Graph and a HardwareConfig in; a Layout and a Schedule out.

pack first rewrites the depthwise convs that run cheaper packed on the array into grouped convs (a
Graph -> Graph step, but the mapper's choice, by its cost, so it lives with the mapper); layout
assigns every value its DRAM view (tensors: DramTensor, the strided views the layout produces and
codegen addresses); mapper's make_schedule gives each conv-shaped node a TileMapping, the
caller's or the default mapper's.  A layer's loop nest is described once here (nest: problem and
mapping; nest_work: tiles, halos, traffic, per-unit work; nest_cost and nest_energy: its latency
and actions; buffers: what it holds in local memory), over numpy for the mapper and over
jax.numpy for the cost model, and codegen emits the same nest and allocates the same buffers.
buffers counts an epilogue's vector instructions by running codegen.tile_expr on a counting
emitter, the one place this stage reads codegen: the count is the emitter's own.
"""
