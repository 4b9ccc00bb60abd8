"""A real small local model with and without the guard: `python -m bench.realmodel.run`, then
`python -m bench.realmodel.analyze` (docs/realmodel.md). Not part of the test suite."""
