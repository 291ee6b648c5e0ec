"""Hooks that record other engines' pipelines with ppscope's recorder, into ppscope run directories.

Each integration imports its engine (torch, ...) itself, inside its own module; importing this package
imports nothing heavy. `ppscope.integrations.pipelining` records torch.distributed.pipelining schedules.
"""
