"""Ray, and what every run does around its own work: join or start a cluster, place one actor per
card and the CPU reference, the driver's typed clients of them, Ray's private names in one module;
claim a run id, time the phases, record provenance, stop on SIGTERM as on Ctrl-C."""
