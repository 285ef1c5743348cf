"""The harness the tests and the benchmarks share: neither imports the other.

``tests/`` asserts behaviour and ``benchmarks/`` measures it; what both need lives here, in one
room: input documents (``_builders``), a stats document (``_stats``), plans and fill patterns
for the executor (``executor``), the pictures' plans and the browser that measures them
(``render``), and real vLLM engines -- the engine venvs, the drivers that run engines in them,
the models, the co-location and OpenAI-server processes (``engine``). Not installed with
kvplan: the repository root is on ``sys.path`` (pytest's rootdir, a benchmark's own line).
"""
