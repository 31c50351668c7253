"""Training prompts for `dspark distill`: varied, seeded, and never the evaluation kit.

A quick probe showed that prompt diversity, not draft capacity, limits a small draft: 3 k templated
prompts were memorised and transferred poorly. So the corpus combines (a) many task templates x many
subjects x random numbers across the text categories, and (b) questions the target writes itself from
meta-prompts (see data.py), sampled at temperature. The 84-prompt bench kit is the held-out evaluation
set: any prompt that shares most of its word trigrams with a kit prompt is dropped (``held_out``).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from dsparkcli.errors import UsageError


@dataclass(frozen=True)
class TrainPrompt:
    category: str
    text: str
    # the template (or meta-prompt) it came from: validation holds whole groups out, so early stopping
    # measures transfer to phrasings the draft never saw, as the kit's prompts are
    group: str = ""


LANGS = ("Python", "JavaScript", "TypeScript", "C", "C++", "Rust", "Go", "Java", "Ruby", "bash", "SQL",
         "Kotlin", "C#", "PHP", "Haskell", "Lua")
CODE_TASKS = (
    "reverses the words in a sentence", "checks whether a string is a palindrome", "counts the vowels in a string",
    "merges two sorted lists", "removes duplicates from a list while keeping order", "flattens a nested list",
    "finds the maximum element of an array", "computes the factorial of a number", "checks whether a number is prime",
    "converts Celsius to Fahrenheit", "sums the digits of an integer", "rotates an array by k positions",
    "finds the second largest number in a list", "counts word frequencies in a text", "validates an email address",
    "parses a CSV line into fields", "reads a file and prints its line count", "computes the greatest common divisor",
    "converts a decimal number to binary", "capitalises the first letter of each word", "transposes a matrix",
    "checks whether two strings are anagrams", "computes the mean and median of a list", "implements bubble sort",
    "implements insertion sort", "implements quicksort", "implements merge sort", "implements a stack",
    "implements a queue using two stacks", "builds a binary search tree with insert and search",
    "performs a breadth-first search on a graph", "performs a depth-first search on a graph",
    "detects a cycle in a linked list", "finds the longest common prefix of a list of strings",
    "generates all permutations of a string", "computes the power set of a list", "chunks a list into groups of n",
    "finds the most common element in a list", "converts a Roman numeral to an integer",
    "formats a number with thousands separators", "parses a date string and prints the weekday",
    "retries a function call up to three times", "memoizes a slow function", "throttles repeated calls",
    "reads JSON from a file and prints one field", "writes a list of records to a CSV file",
    "counts the lines of code in a directory", "checks balanced parentheses in an expression",
    "computes the edit distance between two strings", "finds all pairs in an array that sum to a target",
    "returns the n-th triangular number", "generates a random password", "computes compound interest",
    "evaluates a simple arithmetic expression", "implements a min-heap", "finds the median of two sorted arrays",
    "converts snake_case to camelCase", "splits a string on commas and trims spaces", "zips two lists into a dict",
    "computes the dot product of two vectors", "implements a simple hash map", "draws a text progress bar",
        "groups records by a key and counts them", "deduplicates lines of a text file", "validates a sudoku board", "converts an integer to Roman numerals",
    "computes a running average of a stream of numbers", "finds the longest palindromic substring",
    "merges overlapping intervals", "checks whether a binary tree is balanced", "serialises a tree to a string",
    "implements a trie with insert and prefix search", "implements a rate limiter", "parses command-line arguments",
    "pretty-prints a table of rows", "computes the n-th prime", "finds the k most frequent words",
    "implements a thread-safe counter", "retries an HTTP request with exponential backoff",
    "reads environment variables with defaults", "converts a list of dicts to JSON", "tokenises an arithmetic expression",
    "computes a SHA-256 hash of a file", "finds duplicate files by content", "renames files by a pattern",
    "implements binary search", "computes the Levenshtein distance", "simulates a bank account class",
    "validates an IPv4 address", "finds the intersection of two arrays", "computes matrix multiplication",
    "implements a circular buffer", "normalises whitespace in text",
)
CODE_FORMS = (
    "Write a {lang} function that {task}.", "Implement a {lang} program that {task}.",
    "Show me {lang} code that {task}, with a short explanation.", "In {lang}, write a function that {task} and add comments.",
    "How would you write a {lang} function that {task}? Give an example.",
    "Write a {lang} snippet that {task}, then explain its time complexity.",
    "Give a {lang} solution that {task} and show a usage example.",
    "Write clean, idiomatic {lang} that {task}.",
    "Write a {lang} class that {task}, and explain the design.",
    "I need a {lang} function that {task}. Keep it short and handle edge cases.",
    "Explain step by step how to write a {lang} program that {task}.",
    "Write a {lang} function that {task} in O(n) time and state its complexity.",
    "Can you write a {lang} script that {task}? Explain how it handles empty input.",
    "Refactor a {lang} function that {task} into a cleaner version and explain each change.",
)
CODE_EXTRA = (
    "Explain what a {concept} is in programming, with a short {lang} example.",
    "What is the difference between {concept} and {concept2}? Use {lang} to illustrate.",
    "Write a unit test in {lang} for a function that {task}.",
    "Find and fix the bug in a {lang} function that is supposed to say it {task}; explain the fix.",
    "Explain how {concept} works and when to use it, with {lang} code.",
    "What are common mistakes with {concept} in {lang}, and how do you avoid them?",
    "Write a SQL query that {sql}.",
)
SQL_TASKS = ("counts orders per month",
             "finds customers who never placed an order", "returns the average salary per department",
             "lists the top five products by revenue", "finds duplicate email addresses in a users table",
             "joins employees with their managers", "computes a running total of sales by day",
             "deletes rows older than thirty days", "returns the second highest salary")
CONCEPTS = ("closure", "recursion", "a hash table", "a linked list", "an iterator", "a decorator", "polymorphism",
            "inheritance", "an interface", "a mutex", "a race condition", "garbage collection", "a pointer",
            "a lambda function", "immutability", "a REST API", "a database index", "a transaction", "big-O notation",
            "dynamic programming", "a binary heap", "a trie", "memoization", "a callback", "an exception",
            "a generic type", "a coroutine", "a deadlock", "tail recursion", "a bloom filter")

MATH_FORMS = (
    "Solve for x: {a}x + {b} = {c}. Show your work.", "Solve the equation {a}x - {b} = {c}x + {d}.",
    "What is {a} percent of {big}? Explain the steps.", "Compute {a} * {b} + {c} * {d} step by step.",
    "Find the area of a rectangle with sides {a} cm and {b} cm, and its perimeter.",
    "A car travels {big} km in {a} hours. What is its average speed?",
    "Find the roots of x^2 - {s}x + {p} = 0.", "Simplify the fraction {num}/{den}.",
    "What is the least common multiple of {a} and {b}?", "What is the greatest common divisor of {big} and {big2}?",
    "A shop sells pens at {a} dollars each. How much do {b} pens cost after a {c}% discount?",
    "Compute the derivative of f(x) = {a}x^3 - {b}x^2 + {c}x.", "Integrate {a}x^2 + {b}x + {c} with respect to x.",
    "A circle has radius {a}. Find its area and circumference.", "Convert {big} minutes into hours and minutes.",
    "If {a} workers build a wall in {b} days, how long do {c} workers take?",
    "Find the sum of the first {big} positive integers.", "What is {a}^{e}? Show the multiplication.",
    "A triangle has sides {a}, {b} and {c}. Is it a right triangle? Explain.",
    "The average of {a}, {b}, {c} and x is {d}. Find x.", "Expand ({a}x + {b})^2.",
    "Solve the system: x + y = {s}, x - y = {d}.", "What is the probability of rolling a sum of {s2} with two dice?",
    "A bank account earns {e}% interest per year. What is {big} dollars worth after {a} years?",
    "Find the mean, median and mode of: {a}, {b}, {c}, {d}, {b}.", "Factorise x^2 + {s}x + {p}.",
    "Prove that the sum of two even numbers is even.", "Prove that the product of two odd numbers is odd.",
    "Explain why any number divisible by {a} and {b} is divisible by their least common multiple.",
    "How many minutes are there in {a} days?", "Round {num}.{den} to the nearest whole number and explain.",
    "Is {big} a prime number? Explain how you check.", "Find the slope of the line through ({a}, {b}) and ({c}, {d}).",
    "Write {num}/{den} as a decimal and as a percentage.", "Compute {a}! and explain what a factorial is.",
    "Prove by induction that 1 + 2 + ... + n = n(n + 1)/2.", "Find the sum of the geometric series {a} + {a}*{e} + ... with {b} terms.",
    "What is the expected value of one roll of a fair {s2}-sided die?", "Convert {big} from base 10 to base {e}.",
    "A recipe needs {a} eggs for {b} people. How many eggs for {c} people?", "Find the median of {a}, {c}, {b}, {d}, {big}.",
    "Solve the inequality {a}x - {b} > {c}.", "Find the distance between ({a}, {b}) and ({c}, {d}).",
    "What is the sum of the interior angles of a polygon with {s} sides?", "Find x if {a}^x = {a}^{e} * {a}^{b}.",
    "A price rises by {c}% and then falls by {c}%. Is it back where it started? Explain.",
    "How many ways can {e} people sit in a row of {e} chairs?", "Simplify ({a}x^2 * {b}x^3) / ({c}x^4).",
    "Find the vertex of the parabola y = x^2 - {s}x + {p}.", "Show that {big} is divisible by 3 without dividing.",
)

GENERAL_TOPICS = (
    "volcanoes", "photosynthesis", "the water cycle", "black holes", "the French Revolution", "honeybees",
    "electric cars", "the human heart", "coffee", "the Roman Empire", "solar panels", "sleep", "recycling",
    "the moon landing", "earthquakes", "vaccines", "the internet", "climate change", "chess", "gardening",
    "the ocean tides", "dinosaurs", "the printing press", "meditation", "rainforests", "the stock market",
    "learning a new language", "public speaking", "time management", "healthy breakfast ideas", "the Olympic games",
    "jazz music", "the pyramids of Egypt", "penguins", "wind turbines", "friendship", "cloud computing",
    "the immune system", "bread baking", "renewable energy", "the Great Wall of China", "octopuses",
    "saving money", "running a marathon", "birds migrating", "the Renaissance", "glaciers", "bicycles",
    "board games", "the solar system", "artificial intelligence", "tea ceremonies", "museums", "deserts",
    "the history of writing", "trains", "volunteering", "camping", "electricity", "bees and flowers",
    "the invention of the telephone", "cooking pasta", "mountain climbing", "libraries", "the Northern Lights",
    "recycling plastic", "job interviews", "moving to a new city", "adopting a dog", "caring for houseplants",
    "learning to swim", "the seasons", "lightning", "whales", "coral reefs", "the printing of money",
    "city parks", "photography", "knitting", "the first computers", "space telescopes", "fossils", "kites",
    "learning to cook", "a road trip", "a broken laptop", "a noisy flat", "planting a vegetable garden",
    "writing a CV", "asking for a raise", "a school science fair", "a family reunion", "buying a first car",
    "the history of chocolate", "volcanic islands", "the Silk Road", "the human brain", "sharks", "tornadoes",
    "the Industrial Revolution", "democracy", "money and banks", "the speed of light", "tides and the moon",
    "a power cut at night", "a lost wallet", "a museum visit", "starting a small business", "a wedding toast",
    "a thank-you note", "a complaint to a landlord", "a holiday in the mountains", "composting", "owls",
    "the Vikings", "ancient Greece", "airplanes and flight", "submarines", "the first cars", "hurricanes",
    "a birthday party", "a job offer", "a new neighbour", "good study habits", "a healthy morning routine", "reading more books", "a city at night", "a train journey",
)
GENERAL_FORMS = (
    "Explain {topic} to a ten-year-old.", "Write a short paragraph about {topic}.",
    "Give me five interesting facts about {topic}.", "What are the pros and cons of {topic}?",
    "Write a short poem about {topic}.", "Summarise the history of {topic} in a few sentences.",
    "Give three tips for someone who is new to {topic}.", "Write a friendly email to a friend about {topic}.",
    "Describe {topic} in simple words.", "Why is {topic} important? Answer in a short paragraph.",
    "Write a short story opening that involves {topic}.", "List some common misconceptions about {topic}.",
    "How would you explain {topic} to someone from the 1800s?", "Write a haiku about {topic}.",
    "What questions should I ask to learn more about {topic}?", "Compare {topic} and {topic2} briefly.",
    "Explain {topic} and why it matters, in plain words.", "Give me a list of ideas related to {topic}.",
    "Write a limerick about {topic}.", "Give step-by-step advice on {topic}.", "Tell me something surprising about {topic}.",
    "Write a diary entry from someone experiencing {topic}.", "Describe a typical day involving {topic}.",
)

# Meta-prompts: the target writes its own questions (sampled), so the corpus is not only our templates.
META_FORMS = {
    "code": ("Write one short programming question about {concept} that a student might ask. Reply with the question only.",
             "Write one request a developer might make to get {lang} code for a task involving {concept}. Reply with the request only.",
             "Write one coding exercise about {concept} in {lang}. Reply with the exercise only."),
    "math": ("Write one short math word problem about {topic} with numbers in it. Reply with the problem only.",
             "Write one algebra or geometry exercise with numbers in it. Reply with the exercise only.",
             "Write one probability or statistics question about {topic}. Reply with the question only."),
    "general": ("Write one interesting question someone might ask about {topic}. Reply with the question only.",
                "Write one request a person might make to an assistant about {topic}, such as an email, a plan or a list. Reply with the request only.",
                "Write one question a curious child might ask about {topic}. Reply with the question only."),
}



# ---- Specific prompts (issue 15): the kit's prompts carry material (code to work on, a schema, several
# numbers in a story) and constraints (length, audience, parts). These families build such prompts from
# random parts; each family/form is its own group, so validation can hold whole families out. None
# borrows a kit prompt's wording (test_distill checks that held_out keeps almost all of them).

_NAMES = ("Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goran", "Hana", "Ivan", "Jonas", "Kemi", "Lea",
          "Marco", "Nadia", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tariq", "Uma", "Viktor", "Wen", "Yara")
_VARS = ("items", "values", "nums", "data", "scores", "words", "rows", "prices", "ages", "readings")
_FUNCS = ("process", "transform", "collect", "summarise", "pick", "score", "clean_up", "tally", "build",
          "select_items", "compute", "walk")


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
    "books": ("id", "title", "author_id", "year", "genre"), "authors": ("id", "name", "country"),
    "loans": ("id", "book_id", "member_id", "borrowed_on", "returned_on"), "members": ("id", "name", "joined_on"),
    "students": ("id", "name", "class_id"), "grades": ("student_id", "subject", "score", "term"),
    "classes": ("id", "teacher", "room"), "flights": ("id", "origin", "destination", "departs_at", "seats"),
    "bookings": ("id", "flight_id", "passenger", "price"), "sensors": ("id", "location", "kind"),
    "readings": ("sensor_id", "taken_at", "value"), "products": ("id", "name", "category", "unit_price"),
    "reviews": ("id", "product_id", "stars", "written_on"), "projects": ("id", "name", "budget", "lead_id"),
    "staff": ("id", "name", "team", "hired_on"), "assignments": ("staff_id", "project_id", "hours"),
}
_SQL_PAIRS = (
    ("books", "authors", ("lists each author with the number of books they wrote, most prolific first",
                          "finds authors with no book published after {year}",
                          "returns the newest book of every genre")),
    ("loans", "members", ("shows members who have a loan not yet returned",
                          "counts loans per member in {year}, including members with none",
                          "finds the average loan length in days per member")),
    ("grades", "students", ("returns each student's average score per term",
                            "finds the top {n} students in {subject}",
                            "lists students whose score dropped from one term to the next")),
    ("bookings", "flights", ("computes the revenue of each flight and the share of seats sold",
                             "finds flights from {city} that are more than half empty",
                             "returns the busiest destination per month")),
    ("readings", "sensors", ("returns the latest reading of every sensor with its location",
                             "finds sensors whose average value rose by more than {n} percent week over week",
                             "counts readings per location and day")),
    ("reviews", "products", ("lists products with an average rating below {stars} stars and at least {n} reviews",
                             "returns the best-rated product in each category",
                             "shows how many reviews each category received per year")),
    ("assignments", "staff", ("sums the hours each team spent on each project",
                              "finds staff members assigned to more than {n} projects",
                              "lists projects whose lead has no hours logged on them")),
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
    ("Rust", "error[E0382]: borrow of moved value: `{var}`", "let copy = {var}; println!(\"{{:?}}\", {var});"),
    ("Go", "panic: runtime error: index out of range [{i}] with length {i}", "x := {var}[{i}]"),
    ("Java", "java.lang.NullPointerException", "int n = {var}.size();"),
    ("C", "Segmentation fault (core dumped)", "strcpy(buf, {var});"),
)
ERROR_FORMS = (
    "My {lang} program stops with `{err}` on the line `{line}`. What causes it, and how do I fix it?",
    "I get this error in {lang}:\n{err}\nThe failing line is: {line}\nExplain the error and show two ways to avoid it.",
    "Why would `{line}` raise `{err}` in {lang}? Give a corrected version and a test that would have caught it.",
)

_SIGS = (("merge_counts", "a: dict, b: dict", "adds the counts of two word-count dictionaries"),
         ("window_max", "xs: list[int], k: int", "returns the maximum of every window of k consecutive numbers"),
         ("parse_duration", "text: str", "turns strings like '1h30m' or '45s' into seconds"),
         ("group_by_length", "words: list[str]", "groups words by their length"),
         ("next_business_day", "day: date", "returns the next weekday that is not a Saturday or Sunday"),
         ("clamp_all", "xs: list[float], lo: float, hi: float", "clamps every number into the range [lo, hi]"),
         ("top_n", "scores: dict[str, int], n: int", "returns the n names with the highest scores"),
         ("mask_card", "number: str", "hides all but the last four digits of a card number"),
         ("split_even", "total: int, parts: int", "splits an amount into parts that differ by at most one"),
         ("dedupe_by", "rows: list[dict], key: str", "keeps the first row for each value of a key"))
SIG_FORMS = (
    "Implement `{fn}({args})` in {lang}: it {what}. Handle {edge}, and include {n} example calls with their results.",
    "Write `{fn}({args})`, which {what}. Use {lang}, keep it under {lines} lines, and explain the approach first.",
    "In {lang}, write {fn}({args}) that {what}. Then list the edge cases you considered, such as {edge}.",
)
_EDGES = ("an empty input", "negative numbers", "duplicate values", "very large inputs", "invalid input",
          "a value of zero", "unicode text", "None or null values")


def _code_specific(rng: random.Random) -> tuple[str, str]:
    fam = rng.randrange(4)
    if fam == 0:
        k = rng.randrange(len(CODE_SNIPPET_FORMS))
        lang, code = _snippet(rng)
        other = rng.choice([x for x in ("Python", "JavaScript", "Go", "Rust", "Java", "C#") if x != lang])
        test = "pytest" if lang == "Python" else "Jest"
        return CODE_SNIPPET_FORMS[k].format(lang=lang, code=code, arg=_sample_list(rng), other=other, test=test), f"code:snippet:{k}"
    if fam == 1:
        k = rng.randrange(len(SQL_SCHEMA_FORMS))
        t1, t2, tasks = rng.choice(_SQL_PAIRS)
        task = rng.choice(tasks).format(year=rng.randint(1990, 2024), n=rng.randint(2, 10), subject=rng.choice(
            ("maths", "biology", "history", "art")), city=rng.choice(("Lisbon", "Oslo", "Nairobi", "Lima", "Osaka")),
            stars=rng.randint(2, 4))
        return SQL_SCHEMA_FORMS[k].format(t1=t1, c1=", ".join(_TABLES[t1]), t2=t2, c2=", ".join(_TABLES[t2]),
                                          task=task), f"code:schema:{k}"
    if fam == 2:
        k = rng.randrange(len(ERROR_FORMS))
        lang, err, line = rng.choice(_ERRORS)
        fill = dict(i=rng.randint(1, 9), key=rng.choice(("name", "port", "email", "timeout", "id")),
                    var=rng.choice(_VARS))
        return ERROR_FORMS[k].format(lang=lang, err=err.format(**fill), line=line.format(**fill)), f"code:error:{k}"
    k = rng.randrange(len(SIG_FORMS))
    fn, args, what = rng.choice(_SIGS)
    return SIG_FORMS[k].format(fn=fn, args=args, what=what, lang=rng.choice(("Python", "TypeScript", "Go", "Kotlin")),
                               edge=rng.choice(_EDGES), n=rng.randint(2, 4), lines=rng.choice((10, 15, 20, 30))), f"code:signature:{k}"


_ITEMS = (("notebooks", 2, 9), ("apples", 1, 3), ("tickets", 8, 40), ("plants", 4, 25), ("cables", 3, 15),
          ("loaves of bread", 2, 6), ("tins of paint", 12, 30), ("board games", 15, 60), ("mugs", 3, 12))
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


def _math_specific(rng: random.Random) -> tuple[str, str]:
    if rng.random() < 0.25:
        k = rng.randrange(len(MATH_DATA_FORMS))
        counts = [rng.randint(5, 25) for _ in range(6)]
        text = MATH_DATA_FORMS[k].format(
            xs=", ".join(str(rng.randint(8, 30)) for _ in range(7)), ys=", ".join(str(rng.randint(8, 30)) for _ in range(7)),
            n=sum(counts), counts=", ".join(map(str, counts)))
        return text, f"math:data:{k}"
    k = rng.randrange(len(MATH_STORY_FORMS))
    (i1, lo1, hi1), (i2, lo2, hi2) = rng.sample(_ITEMS, 2)
    name, name2 = rng.sample(_NAMES, 2)
    a, b = rng.randint(2, 9), rng.randint(2, 9)
    p1, p2 = rng.randint(lo1, hi1), rng.randint(lo2, hi2)
    fill = dict(name=name, name2=name2, a=a, b=b, i1=i1, i2=i2, p1=p1, p2=p2,
                bill=((a * p1 + b * p2) // 50 + 1) * 50 + rng.choice((0, 50)), tax=rng.choice((5, 8, 10, 12, 20)),
                cap=rng.randint(10, 60) * 10, r1=rng.randint(12, 40), r2=rng.randint(2, 10), start=rng.randint(0, 9) * 10,
                d1=rng.randint(5, 40), v1=rng.randint(10, 25), rest=rng.choice((10, 15, 20, 30, 45)),
                d2=rng.randint(5, 40), v2=rng.randint(10, 25), age1=rng.randint(20, 60), age2=rng.randint(5, 19),
                ratio=rng.randint(2, 4), g=rng.randint(8, 20), bo=rng.randint(8, 20), pg=rng.randint(2, 9) * 10,
                pb=rng.randint(2, 9) * 10, s1=rng.randint(2, 20) * 5, inc=rng.randint(1, 10) * 5, months=rng.randint(6, 24),
                goal=rng.randint(5, 40) * 100, w1=rng.randint(2, 6), days=rng.randint(6, 20), done=rng.randint(2, 5),
                w2=rng.randint(1, 4), kg=rng.randint(2, 20), pa=rng.randint(2, 5) * 10, share1=rng.randint(2, 5) * 10,
                x=rng.randint(5, 30), up=rng.randint(5, 40), down=rng.randint(5, 40))
    fill["pb"] = fill["pb"] if k != 7 else fill["pa"] + rng.randint(1, 4) * 10
    if k == 8:  # the second friend pays less than what the first leaves
        fill["bill"] = rng.randint(60, 300)
        fill["x"] = rng.randint(5, fill["bill"] * (100 - fill["share1"]) // 100 - 5)
    return MATH_STORY_FORMS[k].format(**fill), f"math:story:{k}"


_AUDIENCES = ("a group of retirees", "new employees on their first day", "teenagers", "a busy parent",
              "a skeptical engineer", "primary school teachers", "tourists who speak little English",
              "a small-business owner", "first-year university students", "a neighbourhood association")
_PIECES = ("a product description", "a short speech", "a blog introduction", "a newsletter paragraph",
           "a set of instructions", "a persuasive paragraph", "a radio announcement", "a museum plaque text",
           "a welcome message", "an FAQ answer")
_STYLES = ("without using jargon", "in a warm, encouraging tone", "with a touch of humour", "in exactly three paragraphs",
           "as a numbered list", "in the second person", "ending with a question", "using one concrete example")
_SITUATIONS = ("I am starting a book club at work", "my elderly neighbour wants to learn to use a smartphone",
               "our team is switching to a four-day week", "I am organising a charity bake sale",
               "my flat gets very cold in winter", "I want to run my first 10 km race in {n} weeks",
               "I just adopted a shy rescue cat", "our school wants to cut food waste in the canteen",
               "I am moving abroad for a year", "my garden gets only {n} hours of sun a day")
_EMAILS = (("a supplier", "asking why an order of {n} boxes arrived late"),
           ("a volunteer", "thanking them for {n} years of help"),
           ("a language school", "requesting a refund for a cancelled course"),
           ("the neighbours", "inviting them to a street clean-up on Saturday"),
           ("a client", "explaining that a price will rise by {n} percent next month"),
           ("a landlord", "asking for a leaking tap to be repaired"),
           ("a new choir member", "welcoming them and explaining how rehearsals work"),
           ("a recruiter", "declining a job offer politely"),
           ("a hotel manager", "reporting that the room had no hot water for {n} days"),
           ("the local council", "asking for a bench in the park near the library"),
           ("a former teacher", "telling them how their lessons helped {n} years later"))
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


def _general_specific(rng: random.Random) -> tuple[str, str]:
    k = rng.randrange(len(GENERAL_SPECIFIC_FORMS))
    n = rng.randint(3, 7)
    t1, t2 = rng.sample(GENERAL_TOPICS, 2)
    recipient, purpose = rng.choice(_EMAILS)
    text = GENERAL_SPECIFIC_FORMS[k].format(
        piece=rng.choice(_PIECES), topic=t1, topic2=t2, audience=rng.choice(_AUDIENCES),
        words=rng.choice((50, 80, 100, 150, 200, 250)), style=rng.choice(_STYLES), n=n,
        situation=rng.choice(_SITUATIONS).format(n=rng.randint(3, 12)), recipient=recipient,
        purpose=purpose.format(n=rng.randint(2, 30)))
    return text, f"general:specific:{k}"


SPECIFIC = {"code": _code_specific, "math": _math_specific, "general": _general_specific}


def _trigrams(text: str) -> set[tuple[str, ...]]:
    words = re.findall(r"[a-z0-9]+", text.lower())
    return {tuple(words[i:i + 3]) for i in range(len(words) - 2)}


def held_out(prompts: Iterable[TrainPrompt], evaluation: Iterable[str], overlap: float = 0.5) -> list[TrainPrompt]:
    """Drop training prompts that share more than ``overlap`` of their word trigrams with an eval prompt."""
    evals = [g for g in (_trigrams(e) for e in evaluation) if g]
    kept = []
    for p in prompts:
        g = _trigrams(p.text)
        if g and any(len(g & e) / min(len(g), len(e)) > overlap for e in evals):
            continue
        kept.append(p)
    return kept


def templated(n: int, seed: int, specific: float = 0.5) -> list[TrainPrompt]:
    """``n`` distinct templated prompts, a third per text category, reproducible from ``seed``; a share
    ``specific`` of them from the material-carrying families (SPECIFIC), the rest one-line templates."""
    rng = random.Random(seed)
    seen: set[str] = set()
    out: list[TrainPrompt] = []
    forms = {"code": CODE_FORMS + CODE_EXTRA, "math": MATH_FORMS, "general": GENERAL_FORMS}
    fill = {
        "code": lambda: dict(lang=rng.choice(LANGS), task=rng.choice(CODE_TASKS), concept=rng.choice(CONCEPTS),
                             concept2=rng.choice(CONCEPTS), sql=rng.choice(SQL_TASKS)),
        "math": lambda: dict(
            a=rng.randint(2, 19), b=rng.randint(2, 29), c=rng.randint(2, 40), d=rng.randint(1, 30),
            e=rng.randint(2, 6), s=rng.randint(3, 15), p=rng.randint(2, 50), s2=rng.randint(2, 12),
            big=rng.randint(40, 960), big2=rng.randint(40, 960), num=rng.randint(2, 99), den=rng.randint(2, 99),
            h=rng.randint(6, 20), m=rng.randint(0, 5), per=2 * rng.randint(10, 40), area=rng.randint(20, 300),
            prime=rng.choice((3, 5, 7, 11, 13))),
        "general": lambda: dict(topic=rng.choice(GENERAL_TOPICS), topic2=rng.choice(GENERAL_TOPICS)),
    }
    cats = list(forms)
    tries = 0
    while len(out) < n and tries < n * 50:
        tries += 1
        cat = cats[len(out) % len(cats)]
        if rng.random() < specific:
            text, group = SPECIFIC[cat](rng)
        else:
            k = rng.randrange(len(forms[cat]))
            text, group = forms[cat][k].format(**fill[cat]()), f"{cat}:{k}"
        if text not in seen:
            seen.add(text)
            out.append(TrainPrompt(cat, text, group))
    return out


def meta_prompts(n: int, seed: int) -> list[TrainPrompt]:
    rng = random.Random(seed + 1)
    out = []
    for i in range(n):
        cat = ("code", "math", "general")[i % 3]
        k = rng.randrange(len(META_FORMS[cat]))
        out.append(TrainPrompt(cat, META_FORMS[cat][k].format(concept=rng.choice(CONCEPTS), lang=rng.choice(LANGS),
                                                              topic=rng.choice(GENERAL_TOPICS)), f"self-{cat}:{k}"))
    return out


def load_user_prompts(path: Path) -> list[TrainPrompt]:
    """``--prompts FILE``: one prompt per line, or JSONL objects with ``prompt`` (and ``category``)."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read prompts file {path}: {e.__class__.__name__}") from e
    out = []
    for n, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        if line.startswith("{"):
            try:
                obj = json.loads(line)
                out.append(TrainPrompt(str(obj.get("category", "user")), str(obj["prompt"]), "user"))
            except (ValueError, KeyError, TypeError) as e:
                raise UsageError(f"{path}:{n}: not a JSON object with a 'prompt' field") from e
        else:
            out.append(TrainPrompt("user", line, "user"))
    if not out:
        raise UsageError(f"prompts file {path} has no prompts")
    return out
