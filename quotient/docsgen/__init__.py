"""The reference pages under ``docs/`` that are generated from the code, so that they cannot drift from it.

A page keeps its prose by hand; the parts that restate the code (every flag of every command, every metric and
alert, the NATS schema) sit between markers and are rewritten from the code by ``quotient docs --write``.
``quotient docs --check`` (and ``tests/unit/test_docs_generated.py``) fails when a page differs from what the code
generates, so a new flag, metric, alert or wire field cannot ship undocumented.

- ``blocks``: the markers and the rewriting of a page's generated blocks;
- ``commands``: the options of every ``quotient`` command, read from the parser each command really builds;
- ``series``: the Prometheus series the scheduler and the agent export;
- ``alerts``: the scheduler's alerts and the Prometheus rules of ``deploy/monitoring/``;
- ``schema``: the NATS subjects and the v1 message schema of ``common/wire.py``;
- ``app``: the pages, their blocks, and the ``quotient docs`` command.
"""
