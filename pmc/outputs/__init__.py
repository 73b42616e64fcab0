"""Everything a run tells the world, as observers of ``pmc.core.events``: record files
(jobstate.log, dagman.out, the resource log), the log set-up and JSON event log, the tally
and what reads it (Prometheus metrics, the status snapshot, progress). ``assemble`` is the
one place that decides which of them a run has."""
