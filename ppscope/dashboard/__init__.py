"""The ppscope dashboard: a Streamlit app (`app.py`) over pure figure builders (`ppscope.analysis.gantt`, `charts.py`),
incremental loading (`data.py`) and path checks (`safety.py`). Start it with `ppscope dashboard PATH...`.

Importing this package imports neither Streamlit nor the app; it holds no analysis (that is `ppscope`).
"""
