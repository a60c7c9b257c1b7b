"""Operators' view of the provider: Prometheus metrics (registry.py), decision events (events.py), the last ones in
`ray status` (ray_status.py), the cost counter's state across monitor restarts (cost_store.py), and the decorators
that produce them around the launcher, backend, view, planner and interruption queue (instrument.py, wired per
provider object by wiring.py). Sits below ray_adapter/ (which wires it) and operate/status.py (which reads the
event log), above launch/ (whose objects it wraps); imports no Ray."""
