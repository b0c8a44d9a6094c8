"""`tuner record`: a recording proxy in front of an OpenAI-compatible server, writing canonical traces without text.

`trace` holds the pure parts (keyed hashes, rows in arrival order), `usage` finds token counts in the
bytes that pass, `proxy` is the ASGI application, `cli` the command that serves it.
"""
