"""The GPU topology of a node: the model (model), read from `nvidia-smi topo -m` text (parse) or
from NVML's answers (readings), the rounds of a pairwise sweep (plan), and its display (render)."""
