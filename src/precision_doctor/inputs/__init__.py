"""Model inputs: images with a preprocessing spec, .npy/.npz, Polygraphy JSON, seeded random."""
