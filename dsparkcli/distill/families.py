"""Training prompts that carry material, as real requests do (issue 15), for corpus.templated.

The kit's prompts are longer and more specific than one-line templates: code to work on, a table schema,
several numbers in a story, constraints on length, audience and parts. These families build such prompts
from random parts; each family/form is its own group (``{cat}:{family}:{k}``), so validation can hold
whole families out. None borrows a kit prompt's wording (test_distill checks that held_out keeps almost
all of them).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

_NAMES = (
    "Ana",
    "Ben",
    "Chen",
    "Dara",
    "Eli",
    "Fatima",
    "Goran",
    "Hana",
    "Ivan",
    "Jonas",
    "Kemi",
    "Lea",
    "Marco",
    "Nadia",
    "Omar",
    "Priya",
    "Quinn",
    "Rosa",
    "Sven",
    "Tariq",
    "Uma",
    "Viktor",
    "Wen",
    "Yara",
)
_VARS = ("items", "values", "nums", "data", "scores", "words", "rows", "prices", "ages", "readings")
_FUNCS = (
    "process",
    "transform",
    "collect",
    "summarise",
    "pick",
    "score",
    "clean_up",
    "tally",
    "build",
    "select_items",
    "compute",
    "walk",
)


def _snippet(rng: random.Random) -> tuple[str, str]:
    """A small generated function (Python or JavaScript) and its language: a loop with a condition, an
    accumulator and an operation, so each prompt carries different code to explain, test or fix."""
    name, arg = rng.choice(_FUNCS), rng.choice(_VARS)
    k, m = rng.randint(0, 9), rng.randint(2, 7)
    cmp_ = rng.choice((">", "<", ">=", "<=", "!=", "=="))
    op = rng.choice(("*", "+", "-", "//", "%"))
    kind = rng.randrange(4)
    if rng.random() < 0.5:
        body = {
            0: f"def {name}({arg}):\n    out = []\n    for x in {arg}:\n        if x {cmp_} {k}:\n            out.append(x {op} {m})\n    return out",
            1: f"def {name}({arg}):\n    total = 0\n    for i, x in enumerate({arg}):\n        if i % {m} == 0 and x {cmp_} {k}:\n            total += x\n    return total",
            2: f"def {name}({arg}, n={m}):\n    seen = {{}}\n    for x in {arg}:\n        seen[x {op} n] = seen.get(x {op} n, 0) + 1\n    return max(seen, key=seen.get) if seen else None",
            3: f"def {name}({arg}):\n    best = None\n    for x in {arg}:\n        if best is None or x {op} {m} {cmp_} best:\n            best = x {op} {m}\n    return best",
        }[kind]
        return "Python", body
    cmp_js = {"==": "===", "!=": "!=="}.get(cmp_, cmp_)
    op_js = "/" if op == "//" else op
    body = {
        0: f"function {name}({arg}) {{\n  const out = [];\n  for (const x of {arg}) {{\n    if (x {cmp_js} {k}) out.push(x {op_js} {m});\n  }}\n  return out;\n}}",
        1: f"function {name}({arg}) {{\n  let total = 0;\n  {arg}.forEach((x, i) => {{\n    if (i % {m} === 0 && x {cmp_js} {k}) total += x;\n  }});\n  return total;\n}}",
        2: f"function {name}({arg}, n = {m}) {{\n  const seen = new Map();\n  for (const x of {arg}) seen.set(x {op_js} n, (seen.get(x {op_js} n) || 0) + 1);\n  return [...seen.entries()].sort((a, b) => b[1] - a[1])[0];\n}}",
        3: f"function {name}({arg}) {{\n  return {arg}.filter(x => x {cmp_js} {k}).map(x => x {op_js} {m}).reduce((a, b) => a + b, 0);\n}}",
    }[kind]
    return "JavaScript", body


def _sample_list(rng: random.Random) -> str:
    return "[" + ", ".join(str(rng.randint(-5, 20)) for _ in range(rng.randint(4, 8))) + "]"


CODE_SNIPPET_FORMS = (
    "What does this {lang} function return for {arg}? Trace it line by line.\n\n{code}",
    "Explain in plain words what this {lang} code does, then suggest a better name for the function.\n\n{code}",
    "Add type annotations and a docstring to this {lang} function, and describe any edge case it mishandles.\n\n{code}",
    "Write three {test} test cases for the function below, including one for an empty input.\n\n{code}",
    "Rewrite this {lang} function so that it is shorter but behaves the same, and prove the two agree on {arg}.\n\n{code}",
    "Here is a {lang} function:\n\n{code}\n\nWhat is its time and space complexity, and can it be made faster?",
    "Translate this {lang} function into {other}, keeping the same behaviour.\n\n{code}",
    "A reviewer says this {lang} function has a subtle problem. Find it and show a fixed version.\n\n{code}",
)

_TABLES = {
    "books": ("id", "title", "author_id", "year", "genre"),
    "authors": ("id", "name", "country"),
    "loans": ("id", "book_id", "member_id", "borrowed_on", "returned_on"),
    "members": ("id", "name", "joined_on"),
    "students": ("id", "name", "class_id"),
    "grades": ("student_id", "subject", "score", "term"),
    "classes": ("id", "teacher", "room"),
    "flights": ("id", "origin", "destination", "departs_at", "seats"),
    "bookings": ("id", "flight_id", "passenger", "price"),
    "sensors": ("id", "location", "kind"),
    "readings": ("sensor_id", "taken_at", "value"),
    "products": ("id", "name", "category", "unit_price"),
    "reviews": ("id", "product_id", "stars", "written_on"),
    "projects": ("id", "name", "budget", "lead_id"),
    "staff": ("id", "name", "team", "hired_on"),
    "assignments": ("staff_id", "project_id", "hours"),
}
_SQL_PAIRS = (
    (
        "books",
        "authors",
        (
            "lists each author with the number of books they wrote, most prolific first",
            "finds authors with no book published after {year}",
            "returns the newest book of every genre",
        ),
    ),
    (
        "loans",
        "members",
        (
            "shows members who have a loan not yet returned",
            "counts loans per member in {year}, including members with none",
            "finds the average loan length in days per member",
        ),
    ),
    (
        "grades",
        "students",
        (
            "returns each student's average score per term",
            "finds the top {n} students in {subject}",
            "lists students whose score dropped from one term to the next",
        ),
    ),
    (
        "bookings",
        "flights",
        (
            "computes the revenue of each flight and the share of seats sold",
            "finds flights from {city} that are more than half empty",
            "returns the busiest destination per month",
        ),
    ),
    (
        "readings",
        "sensors",
        (
            "returns the latest reading of every sensor with its location",
            "finds sensors whose average value rose by more than {n} percent week over week",
            "counts readings per location and day",
        ),
    ),
    (
        "reviews",
        "products",
        (
            "lists products with an average rating below {stars} stars and at least {n} reviews",
            "returns the best-rated product in each category",
            "shows how many reviews each category received per year",
        ),
    ),
    (
        "assignments",
        "staff",
        (
            "sums the hours each team spent on each project",
            "finds staff members assigned to more than {n} projects",
            "lists projects whose lead has no hours logged on them",
        ),
    ),
)
SQL_SCHEMA_FORMS = (
    "We store data in two tables: {t1}({c1}) and {t2}({c2}). Write a SQL query that {task}.",
    "Schema:\n{t1}({c1})\n{t2}({c2})\nWrite a query that {task}, and explain the join you chose.",
    "Using the tables {t1}({c1}) and {t2}({c2}), write SQL that {task}. Mention an index that would speed it up.",
    "Given {t1}({c1}) and {t2}({c2}), I need a report that {task}. Write the query and describe its output columns.",
)

_ERRORS = (
    ("Python", "TypeError: unsupported operand type(s) for +: 'int' and 'str'", "total = total + row[{i}]"),
    ("Python", "KeyError: '{key}'", "value = config['{key}']"),
    ("Python", "IndexError: list index out of range", "last = {var}[len({var})]"),
    ("Python", "AttributeError: 'NoneType' object has no attribute 'strip'", "name = match.group({i}).strip()"),
    ("Python", "ZeroDivisionError: division by zero", "mean = sum({var}) / len({var})"),
    ("JavaScript", "TypeError: Cannot read properties of undefined (reading '{key}')", "const v = user.{key}.length;"),
    ("JavaScript", "ReferenceError: {var} is not defined", "console.log({var}.length);"),
    ("Rust", "error[E0382]: borrow of moved value: `{var}`", 'let copy = {var}; println!("{{:?}}", {var});'),
    ("Go", "panic: runtime error: index out of range [{i}] with length {i}", "x := {var}[{i}]"),
    ("Java", "java.lang.NullPointerException", "int n = {var}.size();"),
    ("C", "Segmentation fault (core dumped)", "strcpy(buf, {var});"),
)
ERROR_FORMS = (
    "My {lang} program stops with `{err}` on the line `{line}`. What causes it, and how do I fix it?",
    "I get this error in {lang}:\n{err}\nThe failing line is: {line}\nExplain the error and show two ways to avoid it.",
    "Why would `{line}` raise `{err}` in {lang}? Give a corrected version and a test that would have caught it.",
)

_SIGS = (
    ("merge_counts", "a: dict, b: dict", "adds the counts of two word-count dictionaries"),
    ("window_max", "xs: list[int], k: int", "returns the maximum of every window of k consecutive numbers"),
    ("parse_duration", "text: str", "turns strings like '1h30m' or '45s' into seconds"),
    ("group_by_length", "words: list[str]", "groups words by their length"),
    ("next_business_day", "day: date", "returns the next weekday that is not a Saturday or Sunday"),
    ("clamp_all", "xs: list[float], lo: float, hi: float", "clamps every number into the range [lo, hi]"),
    ("top_n", "scores: dict[str, int], n: int", "returns the n names with the highest scores"),
    ("mask_card", "number: str", "hides all but the last four digits of a card number"),
    ("split_even", "total: int, parts: int", "splits an amount into parts that differ by at most one"),
    ("dedupe_by", "rows: list[dict], key: str", "keeps the first row for each value of a key"),
)
SIG_FORMS = (
    "Implement `{fn}({args})` in {lang}: it {what}. Handle {edge}, and include {n} example calls with their results.",
    "Write `{fn}({args})`, which {what}. Use {lang}, keep it under {lines} lines, and explain the approach first.",
    "In {lang}, write {fn}({args}) that {what}. Then list the edge cases you considered, such as {edge}.",
)
_EDGES = (
    "an empty input",
    "negative numbers",
    "duplicate values",
    "very large inputs",
    "invalid input",
    "a value of zero",
    "unicode text",
    "None or null values",
)


def _code_specific(rng: random.Random, topics: Sequence[str]) -> tuple[str, str]:
    fam = rng.randrange(4)
    if fam == 0:
        k = rng.randrange(len(CODE_SNIPPET_FORMS))
        lang, code = _snippet(rng)
        other = rng.choice([x for x in ("Python", "JavaScript", "Go", "Rust", "Java", "C#") if x != lang])
        test = "pytest" if lang == "Python" else "Jest"
        return CODE_SNIPPET_FORMS[k].format(
            lang=lang, code=code, arg=_sample_list(rng), other=other, test=test
        ), f"code:snippet:{k}"
    if fam == 1:
        k = rng.randrange(len(SQL_SCHEMA_FORMS))
        t1, t2, tasks = rng.choice(_SQL_PAIRS)
        task = rng.choice(tasks).format(
            year=rng.randint(1990, 2024),
            n=rng.randint(2, 10),
            subject=rng.choice(("maths", "biology", "history", "art")),
            city=rng.choice(("Lisbon", "Oslo", "Nairobi", "Lima", "Osaka")),
            stars=rng.randint(2, 4),
        )
        return SQL_SCHEMA_FORMS[k].format(
            t1=t1, c1=", ".join(_TABLES[t1]), t2=t2, c2=", ".join(_TABLES[t2]), task=task
        ), f"code:schema:{k}"
    if fam == 2:
        k = rng.randrange(len(ERROR_FORMS))
        lang, err, line = rng.choice(_ERRORS)
        fill = dict(
            i=rng.randint(1, 9), key=rng.choice(("name", "port", "email", "timeout", "id")), var=rng.choice(_VARS)
        )
        return ERROR_FORMS[k].format(lang=lang, err=err.format(**fill), line=line.format(**fill)), f"code:error:{k}"
    k = rng.randrange(len(SIG_FORMS))
    fn, args, what = rng.choice(_SIGS)
    return SIG_FORMS[k].format(
        fn=fn,
        args=args,
        what=what,
        lang=rng.choice(("Python", "TypeScript", "Go", "Kotlin")),
        edge=rng.choice(_EDGES),
        n=rng.randint(2, 4),
        lines=rng.choice((10, 15, 20, 30)),
    ), f"code:signature:{k}"


_ITEMS = (
    ("notebooks", 2, 9),
    ("apples", 1, 3),
    ("tickets", 8, 40),
    ("plants", 4, 25),
    ("cables", 3, 15),
    ("loaves of bread", 2, 6),
    ("tins of paint", 12, 30),
    ("board games", 15, 60),
    ("mugs", 3, 12),
)
MATH_STORY_FORMS = (
    "{name} buys {a} {i1} at {p1} dollars each and {b} {i2} at {p2} dollars each, and pays with {bill} dollars. "
    "How much change is there? Then, if the shop adds {tax}% sales tax, how much more would the change shrink?",
    "A tank holds {cap} litres. One pipe fills it at {r1} litres per minute while a leak drains {r2} litres per minute. "
    "Starting from {start} litres, how long until the tank is full? What if the leak is fixed halfway?",
    "{name} cycles {d1} km at {v1} km/h, rests for {rest} minutes, then cycles {d2} km at {v2} km/h. "
    "What is the total time, and what was the average speed over the whole trip including the rest?",
    "{name} is {age1} years old and {name2} is {age2}. In how many years will {name} be exactly twice as old as "
    "{name2}, if ever? And how many years ago was {name} {ratio} times as old as {name2}? Explain both answers.",
    "A class has {g} girls and {bo} boys. {pg}% of the girls and {pb}% of the boys walk to school. "
    "What percentage of the whole class walks, and why is it not the average of the two percentages?",
    "{name} saves {s1} dollars in the first month and {inc} dollars more each month than the month before. "
    "How much has {name} saved after {months} months, and in which month does the total first pass {goal} dollars?",
    "{w1} painters finish a fence in {days} days. After {done} days, {w2} more painters join. "
    "Assuming everyone works at the same rate, on which day is the fence finished?",
    "A {kg} kg bag of mixed nuts is {pa}% almonds and the rest cashews. How many kilograms of almonds must be added "
    "so that almonds make up {pb}% of the mix? Check your answer.",
    "Three friends split a bill of {bill} dollars: {name} pays {share1}% of it, {name2} pays {x} dollars and the third pays the rest. "
    "How much does the third friend pay, and what share of the bill is that?",
    "A pack of {i1} costs {p1} dollars. Its price goes up by {up}% in spring and down by {down}% in autumn. "
    "What is the final price, and what single percentage change would give the same result?",
)
MATH_DATA_FORMS = (
    "Two groups took the same test. Group A scored {xs}; group B scored {ys}. Compare their means and ranges "
    "and say which group was more consistent.",
    "The daily temperatures for a week were {xs} degrees. Find the mean, the median and the standard deviation, "
    "and name the day furthest from the mean.",
    "A die was rolled {n} times with these counts for faces 1 to 6: {counts}. Estimate the probability of each face "
    "and say whether the die looks fair.",
)


def _math_specific(rng: random.Random, topics: Sequence[str]) -> tuple[str, str]:
    if rng.random() < 0.25:
        k = rng.randrange(len(MATH_DATA_FORMS))
        counts = [rng.randint(5, 25) for _ in range(6)]
        text = MATH_DATA_FORMS[k].format(
            xs=", ".join(str(rng.randint(8, 30)) for _ in range(7)),
            ys=", ".join(str(rng.randint(8, 30)) for _ in range(7)),
            n=sum(counts),
            counts=", ".join(map(str, counts)),
        )
        return text, f"math:data:{k}"
    k = rng.randrange(len(MATH_STORY_FORMS))
    (i1, lo1, hi1), (i2, lo2, hi2) = rng.sample(_ITEMS, 2)
    name, name2 = rng.sample(_NAMES, 2)
    a, b = rng.randint(2, 9), rng.randint(2, 9)
    p1, p2 = rng.randint(lo1, hi1), rng.randint(lo2, hi2)
    fill = dict(
        name=name,
        name2=name2,
        a=a,
        b=b,
        i1=i1,
        i2=i2,
        p1=p1,
        p2=p2,
        bill=((a * p1 + b * p2) // 50 + 1) * 50 + rng.choice((0, 50)),
        tax=rng.choice((5, 8, 10, 12, 20)),
        cap=rng.randint(10, 60) * 10,
        r1=rng.randint(12, 40),
        r2=rng.randint(2, 10),
        start=rng.randint(0, 9) * 10,
        d1=rng.randint(5, 40),
        v1=rng.randint(10, 25),
        rest=rng.choice((10, 15, 20, 30, 45)),
        d2=rng.randint(5, 40),
        v2=rng.randint(10, 25),
        age1=rng.randint(20, 60),
        age2=rng.randint(5, 19),
        ratio=rng.randint(2, 4),
        g=rng.randint(8, 20),
        bo=rng.randint(8, 20),
        pg=rng.randint(2, 9) * 10,
        pb=rng.randint(2, 9) * 10,
        s1=rng.randint(2, 20) * 5,
        inc=rng.randint(1, 10) * 5,
        months=rng.randint(6, 24),
        goal=rng.randint(5, 40) * 100,
        w1=rng.randint(2, 6),
        days=rng.randint(6, 20),
        done=rng.randint(2, 5),
        w2=rng.randint(1, 4),
        kg=rng.randint(2, 20),
        pa=rng.randint(2, 5) * 10,
        share1=rng.randint(2, 5) * 10,
        x=rng.randint(5, 30),
        up=rng.randint(5, 40),
        down=rng.randint(5, 40),
    )
    fill["pb"] = fill["pb"] if k != 7 else fill["pa"] + rng.randint(1, 4) * 10
    if k == 8:  # the second friend pays less than what the first leaves
        fill["bill"] = rng.randint(60, 300)
        fill["x"] = rng.randint(5, fill["bill"] * (100 - fill["share1"]) // 100 - 5)
    return MATH_STORY_FORMS[k].format(**fill), f"math:story:{k}"


_AUDIENCES = (
    "a group of retirees",
    "new employees on their first day",
    "teenagers",
    "a busy parent",
    "a skeptical engineer",
    "primary school teachers",
    "tourists who speak little English",
    "a small-business owner",
    "first-year university students",
    "a neighbourhood association",
)
_PIECES = (
    "a product description",
    "a short speech",
    "a blog introduction",
    "a newsletter paragraph",
    "a set of instructions",
    "a persuasive paragraph",
    "a radio announcement",
    "a museum plaque text",
    "a welcome message",
    "an FAQ answer",
)
_STYLES = (
    "without using jargon",
    "in a warm, encouraging tone",
    "with a touch of humour",
    "in exactly three paragraphs",
    "as a numbered list",
    "in the second person",
    "ending with a question",
    "using one concrete example",
)
_SITUATIONS = (
    "I am starting a book club at work",
    "my elderly neighbour wants to learn to use a smartphone",
    "our team is switching to a four-day week",
    "I am organising a charity bake sale",
    "my flat gets very cold in winter",
    "I want to run my first 10 km race in {n} weeks",
    "I just adopted a shy rescue cat",
    "our school wants to cut food waste in the canteen",
    "I am moving abroad for a year",
    "my garden gets only {n} hours of sun a day",
)
_EMAILS = (
    ("a supplier", "asking why an order of {n} boxes arrived late"),
    ("a volunteer", "thanking them for {n} years of help"),
    ("a language school", "requesting a refund for a cancelled course"),
    ("the neighbours", "inviting them to a street clean-up on Saturday"),
    ("a client", "explaining that a price will rise by {n} percent next month"),
    ("a landlord", "asking for a leaking tap to be repaired"),
    ("a new choir member", "welcoming them and explaining how rehearsals work"),
    ("a recruiter", "declining a job offer politely"),
    ("a hotel manager", "reporting that the room had no hot water for {n} days"),
    ("the local council", "asking for a bench in the park near the library"),
    ("a former teacher", "telling them how their lessons helped {n} years later"),
)
GENERAL_SPECIFIC_FORMS = (
    "Write {piece} about {topic} for {audience}, in about {words} words and {style}.",
    "{situation}. Give me {n} practical suggestions, then a short plan for the first week, and finish with one common mistake to avoid.",
    "Write an email to {recipient}, {purpose}. Keep it under {words} words and {style}.",
    "Compare {topic} and {topic2} in a small table with rows for cost, effort and benefits, then recommend one for {audience}.",
    "Explain {topic} to {audience} in {n} short points, {style}.",
    "{situation}. What should I consider first? Answer in {n} bullet points and one closing sentence.",
    "Summarise the main arguments for and against {topic} for {audience}, in at most {words} words.",
    "Draft {piece} announcing an event about {topic}. Include the date, a reason to come and a call to action, {style}.",
)


def _general_specific(rng: random.Random, topics: Sequence[str]) -> tuple[str, str]:
    k = rng.randrange(len(GENERAL_SPECIFIC_FORMS))
    n = rng.randint(3, 7)
    t1, t2 = rng.sample(list(topics), 2)
    recipient, purpose = rng.choice(_EMAILS)
    text = GENERAL_SPECIFIC_FORMS[k].format(
        piece=rng.choice(_PIECES),
        topic=t1,
        topic2=t2,
        audience=rng.choice(_AUDIENCES),
        words=rng.choice((50, 80, 100, 150, 200, 250)),
        style=rng.choice(_STYLES),
        n=n,
        situation=rng.choice(_SITUATIONS).format(n=rng.randint(3, 12)),
        recipient=recipient,
        purpose=purpose.format(n=rng.randint(2, 30)),
    )
    return text, f"general:specific:{k}"


# category -> (rng, the corpus's general topics) -> (text, group)
SPECIFIC = {"code": _code_specific, "math": _math_specific, "general": _general_specific}
