"""A tiny stand-in trainer for the local demo: it hits the FX-tracing race and keeps running."""
