"""telemetry stage."""
