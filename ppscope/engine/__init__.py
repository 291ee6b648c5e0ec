"""The pipeline-parallel inference engine that ppscope profiles: a Llama-style decoder split over ranks
that form a ring, with gpipe / interleaved / serve schedules, every step recorded as a span.

Entry point: `ppscope.engine.launch.run(EngineConfig(...)) -> run directory` (what `ppscope run` calls).
"""
