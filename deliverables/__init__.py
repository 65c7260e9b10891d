"""The curriculum's deliverables, built on the lab's runner (experiments/): answers, the written report, the GPU
campaign, headline figures, compiled memory and time, studies."""
