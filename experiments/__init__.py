"""Plans and runners that reproduce the curriculum's studies."""
