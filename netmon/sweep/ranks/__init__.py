"""What a pair's job runs on each of its nodes: the rank (gloo on the CPU, NCCL on GPUs) and
its GPU set-up (binding, HCA, transport check)."""
