from coinf.wearable.cadence import Cadence


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def drive(self, c: Cadence, gaps: list[float], latency: float = 0.1) -> list[bool]:
        modes = []
        for gap in gaps:
            self.t += gap
            modes.append(c.start(self.t))
            self.t += latency
            c.end(self.t, latency)
        return modes


def test_back_to_back_switches_to_streaming_and_back():
    c, clock = Cadence(), Clock()
    assert clock.drive(c, [1.0, 0.0, 0.001, 0.0, 0.001, 0.0]) == [
        False, False, False, True, True, True
    ]
    assert clock.drive(c, [1.0, 0.5, 0.0]) == [True, False, False]


def test_occasional_requests_stay_sparse():
    c, clock = Cadence(), Clock()
    assert not any(clock.drive(c, [0.5, 0.3, 0.0, 0.4, 0.0, 0.6]))
