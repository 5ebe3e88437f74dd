"""Staged lowering: jaxpr -> graph IR (lower.graph) -> layout and schedule (lower.schedule) -> Program
(lower.codegen)."""
