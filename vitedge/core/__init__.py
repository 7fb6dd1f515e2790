"""Process-wide basics every layer uses: errors, bounds, CPU facts, signals, the terminal."""
