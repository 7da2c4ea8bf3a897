"""Built-in English text for the synthetic workloads, and a helper that lists their targets.

Why: the docs and charts workloads need text that reads like real documents (names, places, dates,
amounts, trends) without downloading a corpus, and a small tokenizer must cover every target. Everything
here is drawn from word lists and sentence templates in this file, driven by a seeded ``random.Random``,
and is plain ASCII. :func:`all_text` yields the targets of a workload (optionally the prompts too) so a
tokenizer can be trained on exactly the text the models will see.

Example:
    >>> import random
    >>> g = TextGen(random.Random(0))
    >>> s = g.sentence()
    >>> s[0].isupper() and s.endswith(".") and s.isascii()
    True
"""

from __future__ import annotations

import random
from typing import Iterator

__all__ = [
    "TextGen",
    "ScrambledTextGen",
    "all_text",
    "FIRST_NAMES",
    "LAST_NAMES",
    "CITIES",
    "COUNTRIES",
    "MONTHS",
    "MONTHS_SHORT",
    "WEEKDAYS",
    "WEEKDAYS_SHORT",
]

FIRST_NAMES = [
    "Anna", "Ben", "Carla", "David", "Elena", "Farid", "Grace", "Hugo", "Irene", "James", "Karin", "Luis",
    "Maria", "Nina", "Omar", "Paula", "Quentin", "Rosa", "Samuel", "Tara", "Ugo", "Vera", "Walter", "Yuki",
    "Zoe", "Aaron", "Bianca", "Chen", "Diana", "Emil", "Fatima", "George", "Hannah", "Ivan", "Julia", "Kofi",
    "Laura", "Martin", "Nadia", "Oscar", "Priya", "Rafael", "Sofia", "Thomas", "Lena", "Mateo",
]
LAST_NAMES = [
    "Keller", "Lopez", "Nakamura", "Okafor", "Schmidt", "Rossi", "Novak", "Silva", "Jensen", "Moreau", "Park",
    "Fischer", "Garcia", "Kowalski", "Haddad", "Ivanova", "Brown", "Costa", "Dubois", "Eriksen", "Fontaine",
    "Gruber", "Hansen", "Ito", "Jovanovic", "Klein", "Larsen", "Meyer", "Nowak", "Olsen", "Petrov", "Quinn",
    "Richter", "Santos", "Tanaka", "Urban", "Vogel", "Walsh", "Young", "Zimmer", "Baker", "Coleman",
]
CITIES = [
    "Lyon", "Porto", "Leeds", "Graz", "Turin", "Malmo", "Krakow", "Ghent", "Bergen", "Seville", "Dublin",
    "Zurich", "Osaka", "Lima", "Quito", "Perth", "Austin", "Denver", "Halifax", "Nairobi", "Accra", "Tunis",
    "Riga", "Tallinn", "Bilbao", "Utrecht", "Aarhus", "Basel", "Bologna", "Cork", "Dresden", "Geneva",
]
COUNTRIES = [
    "Spain", "France", "Italy", "Japan", "Brazil", "Canada", "India", "Mexico", "Chile", "Kenya", "Egypt",
    "Peru", "Norway", "Poland", "Greece", "Turkey", "Sweden", "Ghana", "Vietnam", "Germany", "Austria",
    "Ireland", "Portugal", "Morocco", "Nigeria", "Denmark", "Finland", "Belgium",
]
MONTHS = [
    "January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
    "November", "December",
]
MONTHS_SHORT = [m[:3] for m in MONTHS]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
WEEKDAYS_SHORT = [d[:3] for d in WEEKDAYS]

TITLES = ["Dr.", "Prof.", "Ms.", "Mr."]
ORGS = [
    "the city council", "the research team", "the board", "our company", "the school", "the museum",
    "the hospital", "the library", "the sales team", "the committee", "the project group", "the university",
    "the water authority", "the regional office", "the design team", "the works council", "the club",
]
ROLES = [
    "project lead", "data analyst", "head of finance", "site manager", "chief engineer", "editor",
    "office manager", "lab technician", "sales director", "coordinator", "treasurer", "secretary",
]
NOUNS = [
    "report", "budget", "survey", "plan", "contract", "schedule", "review", "proposal", "study", "audit",
    "workshop", "warehouse", "bridge", "website", "network", "garden", "clinic", "office", "station",
    "program", "course", "policy", "system", "market", "factory", "campus", "archive", "pipeline",
]
ITEMS = [
    "samples", "orders", "visitors", "students", "trees", "books", "tickets", "parcels", "patients", "cars",
    "houses", "bottles", "devices", "members", "laptops", "bicycles", "panels", "sensors", "chairs", "meals",
]
METRICS = [
    "revenue", "attendance", "output", "demand", "traffic", "the error rate", "the average cost",
    "energy use", "water use", "the response time", "total spending", "the number of users", "turnover",
    "the waiting time", "the share of online sales", "production",
]
ADJECTIVES = [
    "new", "old", "large", "small", "main", "annual", "local", "final", "early", "recent", "public",
    "central", "northern", "southern", "weekly", "monthly", "second", "first", "regional", "shared",
]
PROJECTS = [
    "bridge repair", "website update", "school garden", "road survey", "solar project", "data audit",
    "library move", "river cleanup", "office renovation", "staff training", "network upgrade",
    "harbor extension", "tree planting", "museum opening", "budget review", "market study",
]
GOODS = ["coffee", "wheat", "steel", "cotton", "rice", "copper", "timber", "wool", "sugar", "olive oil", "tea",
         "paper", "glass", "salt"]
DOCS = ["report", "invoice", "summary", "draft", "agenda", "minutes", "form", "contract", "slides"]
TREND_UP = ["rose", "increased", "grew", "climbed", "went up"]
TREND_DOWN = ["fell", "decreased", "dropped", "declined", "went down"]
PAST_ACTIONS = [
    ("completed", "the"), ("approved", "the"), ("reviewed", "the"), ("signed", "the"), ("published", "the"),
    ("updated", "the"), ("presented", "the"), ("finished", "the"), ("started", "the"), ("planned", "the"),
]
IMPERATIVES = ["Review", "Send", "Check", "Update", "Print", "Sign", "Archive", "Prepare", "Book", "Confirm",
               "Order", "Collect", "Test", "Clean", "Share"]
HEADING_TOPICS = [
    "Annual Report", "Project Overview", "Results", "Budget Summary", "Methods and Data", "Meeting Notes",
    "Introduction", "Background", "Key Findings", "Next Steps", "Sales Review", "Site Visit",
    "Quarterly Update", "Staff News", "Product Launch", "Travel Plan", "Safety Check", "Market Outlook",
    "Course Outline", "Lab Notes", "Field Study", "Conclusions", "Open Issues", "Timeline",
]
SECTION_WORDS = ["Summary", "Details", "Costs", "Schedule", "Findings", "Tasks", "Notes", "Figures", "Goals",
                 "Risks", "Data", "Overview", "Actions", "Contacts"]


def _cap(s: str) -> str:
    return s[:1].upper() + s[1:]


class TextGen:
    """Random, plausible English driven by one seeded ``random.Random`` (same seed, same text).

    Example:
        >>> import random
        >>> a, b = TextGen(random.Random(5)), TextGen(random.Random(5))
        >>> a.paragraph() == b.paragraph()
        True
        >>> TextGen(random.Random(1)).date().split()[0] in MONTHS
        True
    """

    def __init__(self, rng: random.Random):
        self.rng = rng

    # ------------------------------------------------------------------ atoms
    def pick(self, seq):
        return seq[self.rng.randrange(len(seq))]

    def name(self) -> str:
        r = self.rng.random()
        first, last = self.pick(FIRST_NAMES), self.pick(LAST_NAMES)
        if r < 0.25:
            return f"{self.pick(TITLES)} {last}"
        if r < 0.4:
            return f"{first[0]}. {last}"
        return f"{first} {last}"

    def year(self) -> int:
        return self.rng.randint(1995, 2025)

    def date(self) -> str:
        return f"{self.pick(MONTHS)} {self.rng.randint(1, 28)}, {self.year()}"

    def number(self, lo: int = 2, hi: int = 950) -> str:
        return f"{self.rng.randint(lo, hi):,}"

    def money(self) -> str:
        r = self.rng.random()
        if r < 0.4:
            return f"${self.rng.randint(12, 999)}"
        if r < 0.8:
            return f"${self.rng.randint(1, 98) * 100 + self.rng.choice([0, 0, 50]):,}"
        return f"${self.rng.randint(11, 950) / 10:.1f} million"

    def percent(self) -> str:
        if self.rng.random() < 0.7:
            return f"{self.rng.randint(1, 60)}%"
        return f"{self.rng.randint(5, 400) / 10:.1f}%"

    def decimal(self) -> str:
        return f"{self.rng.randint(1, 999) / 100:.2f}"

    # ------------------------------------------------------------------ sentences
    def sentence(self) -> str:
        """One sentence from a template, with numbers, names, places and dates filled in."""
        g, p = self, self.pick
        templates = [
            lambda: f"{_cap(p(ORGS))} reported that {p(METRICS)} {p(TREND_UP + TREND_DOWN)} by {g.percent()} in {g.year()}.",
            lambda: f"The {p(ADJECTIVES)} {p(NOUNS)} was {p(PAST_ACTIONS)[0]} on {g.date()}.",
            lambda: f"{g.name()} led the {p(PROJECTS)} with a budget of {g.money()}.",
            lambda: f"A total of {g.number()} {p(ITEMS)} were counted in {p(CITIES)} last {p(['week', 'month', 'year', 'spring', 'autumn'])}.",
            lambda: f"The new {p(NOUNS)} in {p(CITIES)} will open in {p(MONTHS)} {g.year()}.",
            lambda: f"According to {g.name()}, the {p(NOUNS)} needs {g.number(2, 40)} more {p(ITEMS)}.",
            lambda: f"In {g.year()}, {p(COUNTRIES)} exported {g.number(10, 900)} tonnes of {p(GOODS)}.",
            lambda: f"The meeting on {p(WEEKDAYS)} was attended by {g.number(3, 120)} {p(['members', 'guests', 'people', 'students'])}.",
            lambda: f"Please send the {p(DOCS)} to {g.name()} before {p(WEEKDAYS)}.",
            lambda: self._growth(),
            lambda: self._arith(),
            lambda: f"The ratio x/y was {g.decimal()} for the {p(ADJECTIVES)} {p(ITEMS)}.",
            lambda: f"Each of the {p(ITEMS)} weighs about {g.number(2, 90)} kg.",
            lambda: f"{g.name()}, our {p(ROLES)}, {p(PAST_ACTIONS)[0]} the {p(NOUNS)} in {p(CITIES)}.",
            lambda: f"Work on the {p(PROJECTS)} started on {g.date()} and took {g.number(2, 30)} weeks.",
            lambda: f"Most {p(ITEMS)} arrived late because of {p(['heavy rain', 'a strike', 'snow', 'a road closure', 'a power cut', 'high demand'])}.",
            lambda: f"{_cap(p(METRICS))} in {p(CITIES)} is now {g.percent()} {p(['higher', 'lower'])} than in {g.year()}.",
            lambda: f"The {p(DOCS)} lists {g.number(2, 60)} open points and {g.number(2, 30)} closed ones.",
            lambda: f"We expect {p(METRICS)} to reach {g.number(100, 9000)} units by {p(MONTHS)}.",
            lambda: f"The {p(ADJECTIVES)} {p(PROJECTS)} cost {g.money()}, which is {g.percent()} below plan.",
            lambda: f"Tickets cost {g.money()} for adults and {g.money()} for children.",
            lambda: f"{g.name()} joined {p(ORGS)} in {g.year()} as {p(['a', 'the'])} {p(ROLES)}.",
            lambda: f"The {p(NOUNS)} is open from {g.rng.randint(7, 10)} am to {g.rng.randint(4, 8)} pm on weekdays.",
            lambda: f"About {g.percent()} of the {p(ITEMS)} came from {p(COUNTRIES)}.",
        ]
        return templates[self.rng.randrange(len(templates))]()

    def _growth(self) -> str:
        y0 = self.rng.randint(1995, 2020)
        y1 = y0 + self.rng.randint(1, 5)
        a = self.rng.randint(10, 500)
        b = a + self.rng.randint(-a + 1, 400)
        word = "grew" if b > a else "fell" if b < a else "stayed"
        return f"Between {y0} and {y1}, {self.pick(METRICS)} {word} from {a} to {b}."

    def _arith(self) -> str:
        a, b = self.rng.randint(2, 40), self.rng.randint(2, 60)
        cost = self.rng.randint(2, 90)
        return f"Since {a} + {b} = {a + b} {self.pick(ITEMS)} are needed at ${cost} each, the total is ${(a + b) * cost:,}."

    def paragraph(self, n_min: int = 1, n_max: int = 3) -> str:
        return " ".join(self.sentence() for _ in range(self.rng.randint(n_min, n_max)))

    # ------------------------------------------------------------------ document blocks
    def heading(self, level: int = 1) -> str:
        r = self.rng.random()
        if level == 1:
            topic = self.pick(HEADING_TOPICS)
            if r < 0.4:
                return f"{topic} {self.year()}"
            if r < 0.6:
                return f"{topic}: {self.pick(CITIES)}"
            return topic
        if r < 0.5:
            return self.pick(SECTION_WORDS)
        if r < 0.75:
            return f"{self.pick(ADJECTIVES).capitalize()} {self.pick(SECTION_WORDS)}"
        return f"{self.pick(SECTION_WORDS)} for {self.pick(MONTHS)}"

    def list_item(self) -> str:
        p = self.pick
        templates = [
            lambda: f"{p(IMPERATIVES)} the {p(DOCS)} by {p(MONTHS_SHORT)} {self.rng.randint(1, 28)}",
            lambda: f"{self.number(2, 400)} {p(ITEMS)} in {p(CITIES)}",
            lambda: f"{self.name()}, {p(ROLES)}",
            lambda: f"{_cap(p(PROJECTS))}: {self.money()}",
            lambda: f"{p(IMPERATIVES)} the {p(ADJECTIVES)} {p(NOUNS)}",
            lambda: f"{_cap(p(METRICS))} {p(TREND_UP + TREND_DOWN)} {self.percent()}",
            lambda: f"Meet {self.name()} on {p(WEEKDAYS)}",
            lambda: f"{_cap(p(GOODS))} from {p(COUNTRIES)}",
            lambda: f"Deadline: {self.date()}",
        ]
        return templates[self.rng.randrange(len(templates))]()

    def table(self, n_rows: int, n_cols: int | None = None) -> tuple[list[str], list[list[str]]]:
        """A small table: ``(header, rows)`` of strings from one of several column schemas."""
        r, p = self.rng, self.pick
        schemas = [
            (["Name", "City", "Age"], lambda: [self.name(), p(CITIES), str(r.randint(19, 78))]),
            (["Product", "Price", "Units"], lambda: [f"{p(['Model', 'Type', 'Kit', 'Set'])} {r.choice('ABCDEFGHKLMNPRSTX')}{r.randint(1, 9)}",
                                                  f"${r.randint(5, 900)}", str(r.randint(1, 500))]),
            (["Year", "Revenue", "Growth"], None),
            (["Month", "Visitors", "Change"], None),
            (["Country", "Exports", "Share"], lambda: [p(COUNTRIES), f"{r.randint(10, 999)} t", f"{r.randint(1, 40)}%"]),
            (["Item", "Qty", "Cost"], lambda: [_cap(p(ITEMS)), str(r.randint(1, 80)), self.money().replace(" million", "M")]),
            (["Task", "Owner", "Due"], lambda: [f"{p(IMPERATIVES)} {p(DOCS)}", p(FIRST_NAMES), f"{p(MONTHS_SHORT)} {r.randint(1, 28)}"]),
            (["City", "Temp", "Rain"], lambda: [p(CITIES), f"{r.randint(-5, 35)} C", f"{r.randint(0, 120)} mm"]),
            (["Name", "Role"], lambda: [self.name(), p(ROLES)]),
        ]
        header, row_fn = schemas[r.randrange(len(schemas))]
        if header[0] == "Year":
            y = r.randint(1998, 2020)
            rows = [[str(y + i), f"${r.randint(10, 990)}k", f"{r.randint(-15, 30)}%"] for i in range(n_rows)]
        elif header[0] == "Month":
            m = r.randint(0, 12 - n_rows)
            rows = [[MONTHS_SHORT[m + i], f"{r.randint(100, 9999):,}", f"{r.choice(['+', '-'])}{r.randint(0, 25)}%"]
                    for i in range(n_rows)]
        else:
            rows = [row_fn() for _ in range(n_rows)]
        if n_cols is not None and n_cols < len(header):
            header = header[:n_cols]
            rows = [row[:n_cols] for row in rows]
        return header, rows

    def formula(self) -> str:
        """A short formula in plain text; ``^`` marks a superscript (``E = mc^2``), fractions are ``x/y``."""
        r, p = self.rng, self.pick
        a, b, c = r.randint(2, 9), r.randint(1, 20), r.randint(1, 9)
        v = p(["x", "y", "t", "n", "z"])
        templates = [
            lambda: "E = mc^2",
            lambda: "a^2 + b^2 = c^2",
            lambda: f"y = {a}x + {b}",
            lambda: "F = m a",
            lambda: "v = d/t",
            lambda: "A = pi r^2",
            lambda: "x = (a + b)/2",
            lambda: f"P = {b}/{b + a}",
            lambda: "s = v t + a t^2/2",
            lambda: f"f({v}) = {a}{v}^2 + {b}{v} + {c}",
            lambda: f"{a * 7} + {b} = {a * 7 + b}",
            lambda: f"{a} * {b} = {a * b}",
            lambda: f"{v}^{c} / {v}^2 = {v}^{c - 2}" if c > 2 else f"{v}^3 / {v} = {v}^2",
            lambda: "p = m v",
            lambda: "(a + b)^2 = a^2 + 2ab + b^2",
            lambda: f"k = {a}/{b + 10}",
            lambda: "V = l w h",
            lambda: f"r = {a}.{c} cm",
        ]
        return templates[r.randrange(len(templates))]()


class ScrambledTextGen(TextGen):
    """:class:`TextGen` whose every letter and digit is replaced by a random one of the same class (case
    kept; spaces, punctuation and formula markup kept): the same layouts and lengths, no language prior.

    Why: a small VLM trained on plausible text learns to predict it from the text alone and never reads the
    image (DESIGN.md measured it; teacher-forced accuracy on docs blocks with a blank image was within 3 points
    of the real one). Scrambled text can only be transcribed by reading.

    Example:
        >>> import random
        >>> s = ScrambledTextGen(random.Random(0)).list_item()
        >>> s == ScrambledTextGen(random.Random(0)).list_item(), s == TextGen(random.Random(0)).list_item()
        (True, False)
    """

    def scramble(self, text: str) -> str:
        r = self.rng
        out = []
        for ch in text:
            if "a" <= ch <= "z":
                ch = chr(97 + r.randrange(26))
            elif "A" <= ch <= "Z":
                ch = chr(65 + r.randrange(26))
            elif "0" <= ch <= "9":
                ch = chr(48 + r.randrange(10))
            out.append(ch)
        return "".join(out)

    def sentence(self) -> str:  # paragraphs are made of sentences
        return self.scramble(super().sentence())

    def heading(self, level: int = 1) -> str:
        return self.scramble(super().heading(level))

    def list_item(self) -> str:
        return self.scramble(super().list_item())

    def table(self, n_rows: int, n_cols: int | None = None):
        header, rows = super().table(n_rows, n_cols)
        return [self.scramble(h) for h in header], [[self.scramble(c) for c in row] for row in rows]

    def formula(self) -> str:
        return self.scramble(super().formula())


def all_text(workload, split: str = "train", n: int = 1000, start: int = 0,
             include_prompts: bool = False) -> Iterator[str]:
    """Yield the targets (and, with ``include_prompts``, the prompts first) of ``n`` items of ``split``.

    ``workload`` is a :class:`~mmspec.workloads.Workload` or a registered name. Handy to train a small
    tokenizer on exactly the text the testbed uses.

    Example:
        >>> texts = list(all_text("charts", "train", 3, include_prompts=True))
        >>> len(texts), all(t.isascii() for t in texts)
        (6, True)
    """
    if isinstance(workload, str):
        from mmspec.workloads import get_workload

        workload = get_workload(workload)
    # Seeded workloads can skip the pixels: same prompt and target, 10-25x faster.
    make = getattr(workload, "text_example", workload.example)
    for i in range(start, start + n):
        ex = make(split, i)
        if include_prompts:
            yield ex.prompt
        yield ex.target
