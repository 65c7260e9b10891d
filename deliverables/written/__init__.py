"""The written report's (docs/report/) numbered figures and every number it states, each from its source.

It reads both the plans' reports (deliverables.report) and the curriculum's answers (deliverables.answers), so it
sits above both: `python -m deliverables.written.figures`, `python -m deliverables.written.claims`.
"""
