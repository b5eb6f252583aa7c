"""The engine process: owns the llama.cpp model and runs the decode loop."""
