"""Nsight Systems: read an `nsys export --type sqlite` file as a Trace, and write a Trace as one."""
