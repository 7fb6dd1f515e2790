"""What a bundle holds: the input spec, preprocessing, the manifest and its trust."""
