"""llama-server's API: /completion, /infill, its small routes and its router's model routes."""
