"""The standing hostile-agent suite: each test is one attack an agent (or code it wrote, run by a
gate) makes on the boundary (docs/agents.md, "The sandbox boundary"), through the real CLIs where
the attack needs one, with an oracle the agent cannot touch. `make test` runs it. A new capability
brings the attack on it here."""
