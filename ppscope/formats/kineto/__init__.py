"""PyTorch profiler (Kineto) JSON: one file per rank, read fast as columns and joined into one Trace."""
