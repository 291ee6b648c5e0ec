"""torch.distributed.pipelining in a Kineto trace: its actions, their stages and the schedule they make."""
