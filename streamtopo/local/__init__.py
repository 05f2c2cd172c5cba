"""The embedded platform of ``streamtopo run``: executors as local processes (:mod:`.platform`), the run
itself (:mod:`.runner`), the controller's adaptation loop over them (:mod:`.loop`), the resilience drills
(:mod:`.drills`) and the live view (:mod:`.progress`). It composes runtime and controller, which never
import it."""
