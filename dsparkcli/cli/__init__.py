"""Thin Typer layer: parse, call the core, render. No logic that a test of the core would miss."""
