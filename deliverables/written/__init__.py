"""The written report's (docs/report/) figures and claims; above both deliverables.report and deliverables.answers."""
