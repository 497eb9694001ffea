"""Reasoning and tool-call parsing: the interfaces and the shared machinery plugins build on."""
