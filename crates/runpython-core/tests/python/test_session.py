"""The session interpreter's interrupt bookkeeping (`runpython_session._Session`), without its sockets."""

import pathlib
import sys
import threading
import unittest

CODE_DIR = str(pathlib.Path(__file__).resolve().parents[2] / "src" / "child" / "python")
if CODE_DIR not in sys.path:
    sys.path.insert(0, CODE_DIR)

import runpython_session  # noqa: E402


def session():
    """A `_Session` with its state as `__init__` leaves it, and no control socket or reader thread."""
    s = object.__new__(runpython_session._Session)
    s.cells = []
    s.lock = threading.Lock()
    s.ready = threading.Condition(s.lock)
    s.running = False
    s.received = 0
    s.current = 0
    s.current_begun = True
    s.interrupt_upto = 0
    s.closed = False
    s.main_thread = threading.main_thread().ident
    return s


def arrive(s, message):
    with s.lock:
        s.received += 1
        s.cells.append((message, []))


class Interrupts(unittest.TestCase):
    def test_an_interrupt_before_the_cell_began_interrupts_it_at_its_start(self):
        s = session()
        arrive(s, {"type": "cell"})
        s.next_cell()
        s._interrupt()  # the host's timeout passed while the cell was still being set up
        with self.assertRaises(KeyboardInterrupt):
            s._begin()
        self.assertFalse(s.running)

    def test_an_interrupt_for_a_queued_cell_interrupts_it_at_its_start(self):
        s = session()
        arrive(s, {"type": "cell"})
        s._interrupt()
        s.next_cell()
        with self.assertRaises(KeyboardInterrupt):
            s._begin()

    def test_an_interrupt_after_a_cell_ended_leaves_the_next_cell_alone(self):
        s = session()
        arrive(s, {"type": "cell"})
        s.next_cell()
        s._begin()
        with s.lock:
            s.running = False  # the cell ended; its answer is on its way
        s._interrupt()
        arrive(s, {"type": "cell"})
        s.next_cell()
        s._begin()
        self.assertTrue(s.running)

    def test_a_message_that_never_began_does_not_carry_an_interrupt_to_the_next(self):
        s = session()
        arrive(s, {"type": "snapshot"})
        s.next_cell()  # answered without beginning (e.g. refused)
        s._interrupt()
        arrive(s, {"type": "cell"})
        s.next_cell()
        s._begin()
        self.assertTrue(s.running)


if __name__ == "__main__":
    unittest.main()
