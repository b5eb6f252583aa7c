"""The doors: one package per API, each reading its own wire format into the layers below and writing the answer back.

A door imports the layers below it (chat, http, core, engine) and no other door."""
