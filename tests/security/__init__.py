"""The standing hostile-agent suite: each test is one attack an agent (or code it wrote, run by a
gate) makes on the boundary, through the real CLIs where the attack needs one, with an oracle the
agent cannot touch. `make test` runs it; DEVELOPERS.md: "When you add a capability, ask how a
hostile agent would abuse it, and add that attack to tests/security/"."""
