"""What the engine runs on a CUDA device: decode attention through the block tables in torch ops
(paged_attention.py) and CUDA graphs for decode batches (graphs.py)."""
