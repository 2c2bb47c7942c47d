"""`netmon selftest`: what netmon could not check without a GPU, checked on a node that has one
(docs/GPU-ACCEPTANCE.md); the same checks run reduced on gloo CPU ranks in CI."""
