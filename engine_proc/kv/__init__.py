"""The KV cells' life: which stream (slot) a sequence decodes in and what its prefix reuses (slots), the cache of
finished sequences' cells (prefix_cache), their copies in host RAM (host_cache) and on disk (disk_cache), the
file format (kv_file), and llama-server's slot save/restore (slot_files)."""
