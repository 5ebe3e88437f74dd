"""Staged lowering: jaxpr -> graph IR -> schedule -> Program."""
