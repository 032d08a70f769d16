"""DDP communication hooks, under the module paths torch uses."""
