"""The LangGraph wiring: the state machine (`builder`), its routing, checkpoints, forks, review and the CLI.

Only `builder` imports the nodes; the rest imports tools and state. Nothing under nodes or tools imports graph
(tests/unit/test_layout.py checks both).
"""
