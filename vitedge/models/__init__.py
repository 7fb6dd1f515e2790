"""Model intake: read a checkpoint, understand it, build a torch module ready to export."""
