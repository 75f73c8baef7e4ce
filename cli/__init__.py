"""Command-line tools of mrc-ebpf (mrcctl)."""
