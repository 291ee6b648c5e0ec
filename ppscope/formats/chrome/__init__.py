"""Chrome trace-event JSON, for Perfetto and chrome://tracing: a Trace or a run written a rank at a time."""
