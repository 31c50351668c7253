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

from dsparkcli.distill.families import SPECIFIC
from dsparkcli.errors import UsageError


@dataclass(frozen=True)
class TrainPrompt:
    category: str
    text: str
    # the template (or meta-prompt) it came from, and the subject it was filled with (group_name):
    # validation holds whole templates and subjects out, so early stopping measures transfer to
    # phrasings and tasks the draft never saw, as the kit's prompts are
    group: str = ""


# One-line templates draw a subject from a shared list (a code task, a concept, a general topic). A draft
# learns the answers to those subjects: the same templates scored 2.69 on training tasks and 2.22 on new
# ones (study/results/real3/transfer-code.json), so validation must hold subjects out too, not only templates.
# The material-carrying families (families.py) also draw general topics but name no subject (their
# material is random), so a held-out topic can still reach training through one of them.
SUBJECT_KEYS = ("task", "sql", "concept", "topic")
_SUBJECT_SEP = "|"


def group_name(template: str, subject: str = "") -> str:
    return f"{template}{_SUBJECT_SEP}{subject}" if subject else template


def split_group(group: str) -> tuple[str, str]:
    """(template, subject) of a group name; subject '' when the prompt had none (or an older dataset)."""
    template, _, subject = group.partition(_SUBJECT_SEP)
    return template, subject


LANGS = (
    "Python",
    "JavaScript",
    "TypeScript",
    "C",
    "C++",
    "Rust",
    "Go",
    "Java",
    "Ruby",
    "bash",
    "SQL",
    "Kotlin",
    "C#",
    "PHP",
    "Haskell",
    "Lua",
)
CODE_TASKS = (
    "reverses the words in a sentence",
    "checks whether a string is a palindrome",
    "counts the vowels in a string",
    "merges two sorted lists",
    "removes duplicates from a list while keeping order",
    "flattens a nested list",
    "finds the maximum element of an array",
    "computes the factorial of a number",
    "checks whether a number is prime",
    "converts Celsius to Fahrenheit",
    "sums the digits of an integer",
    "rotates an array by k positions",
    "finds the second largest number in a list",
    "counts word frequencies in a text",
    "validates an email address",
    "parses a CSV line into fields",
    "reads a file and prints its line count",
    "computes the greatest common divisor",
    "converts a decimal number to binary",
    "capitalises the first letter of each word",
    "transposes a matrix",
    "checks whether two strings are anagrams",
    "computes the mean and median of a list",
    "implements bubble sort",
    "implements insertion sort",
    "implements quicksort",
    "implements merge sort",
    "implements a stack",
    "implements a queue using two stacks",
    "builds a binary search tree with insert and search",
    "performs a breadth-first search on a graph",
    "performs a depth-first search on a graph",
    "detects a cycle in a linked list",
    "finds the longest common prefix of a list of strings",
    "generates all permutations of a string",
    "computes the power set of a list",
    "chunks a list into groups of n",
    "finds the most common element in a list",
    "converts a Roman numeral to an integer",
    "formats a number with thousands separators",
    "parses a date string and prints the weekday",
    "retries a function call up to three times",
    "memoizes a slow function",
    "throttles repeated calls",
    "reads JSON from a file and prints one field",
    "writes a list of records to a CSV file",
    "counts the lines of code in a directory",
    "checks balanced parentheses in an expression",
    "computes the edit distance between two strings",
    "finds all pairs in an array that sum to a target",
    "returns the n-th triangular number",
    "generates a random password",
    "computes compound interest",
    "evaluates a simple arithmetic expression",
    "implements a min-heap",
    "finds the median of two sorted arrays",
    "converts snake_case to camelCase",
    "splits a string on commas and trims spaces",
    "zips two lists into a dict",
    "computes the dot product of two vectors",
    "implements a simple hash map",
    "draws a text progress bar",
    "groups records by a key and counts them",
    "deduplicates lines of a text file",
    "validates a sudoku board",
    "converts an integer to Roman numerals",
    "computes a running average of a stream of numbers",
    "finds the longest palindromic substring",
    "merges overlapping intervals",
    "checks whether a binary tree is balanced",
    "serialises a tree to a string",
    "implements a trie with insert and prefix search",
    "implements a rate limiter",
    "parses command-line arguments",
    "pretty-prints a table of rows",
    "computes the n-th prime",
    "finds the k most frequent words",
    "implements a thread-safe counter",
    "retries an HTTP request with exponential backoff",
    "reads environment variables with defaults",
    "converts a list of dicts to JSON",
    "tokenises an arithmetic expression",
    "computes a SHA-256 hash of a file",
    "finds duplicate files by content",
    "renames files by a pattern",
    "implements binary search",
    "computes the Levenshtein distance",
    "simulates a bank account class",
    "validates an IPv4 address",
    "finds the intersection of two arrays",
    "computes matrix multiplication",
    "implements a circular buffer",
    "normalises whitespace in text",
)
CODE_FORMS = (
    "Write a {lang} function that {task}.",
    "Implement a {lang} program that {task}.",
    "Show me {lang} code that {task}, with a short explanation.",
    "In {lang}, write a function that {task} and add comments.",
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
SQL_TASKS = (
    "counts orders per month",
    "finds customers who never placed an order",
    "returns the average salary per department",
    "lists the top five products by revenue",
    "finds duplicate email addresses in a users table",
    "joins employees with their managers",
    "computes a running total of sales by day",
    "deletes rows older than thirty days",
    "returns the second highest salary",
)
CONCEPTS = (
    "closure",
    "recursion",
    "a hash table",
    "a linked list",
    "an iterator",
    "a decorator",
    "polymorphism",
    "inheritance",
    "an interface",
    "a mutex",
    "a race condition",
    "garbage collection",
    "a pointer",
    "a lambda function",
    "immutability",
    "a REST API",
    "a database index",
    "a transaction",
    "big-O notation",
    "dynamic programming",
    "a binary heap",
    "a trie",
    "memoization",
    "a callback",
    "an exception",
    "a generic type",
    "a coroutine",
    "a deadlock",
    "tail recursion",
    "a bloom filter",
)

MATH_FORMS = (
    "Solve for x: {a}x + {b} = {c}. Show your work.",
    "Solve the equation {a}x - {b} = {c}x + {d}.",
    "What is {a} percent of {big}? Explain the steps.",
    "Compute {a} * {b} + {c} * {d} step by step.",
    "Find the area of a rectangle with sides {a} cm and {b} cm, and its perimeter.",
    "A car travels {big} km in {a} hours. What is its average speed?",
    "Find the roots of x^2 - {s}x + {p} = 0.",
    "Simplify the fraction {num}/{den}.",
    "What is the least common multiple of {a} and {b}?",
    "What is the greatest common divisor of {big} and {big2}?",
    "A shop sells pens at {a} dollars each. How much do {b} pens cost after a {c}% discount?",
    "Compute the derivative of f(x) = {a}x^3 - {b}x^2 + {c}x.",
    "Integrate {a}x^2 + {b}x + {c} with respect to x.",
    "A circle has radius {a}. Find its area and circumference.",
    "Convert {big} minutes into hours and minutes.",
    "If {a} workers build a wall in {b} days, how long do {c} workers take?",
    "Find the sum of the first {big} positive integers.",
    "What is {a}^{e}? Show the multiplication.",
    "A triangle has sides {a}, {b} and {c}. Is it a right triangle? Explain.",
    "The average of {a}, {b}, {c} and x is {d}. Find x.",
    "Expand ({a}x + {b})^2.",
    "Solve the system: x + y = {s}, x - y = {d}.",
    "What is the probability of rolling a sum of {s2} with two dice?",
    "A bank account earns {e}% interest per year. What is {big} dollars worth after {a} years?",
    "Find the mean, median and mode of: {a}, {b}, {c}, {d}, {b}.",
    "Factorise x^2 + {s}x + {p}.",
    "Prove that the sum of two even numbers is even.",
    "Prove that the product of two odd numbers is odd.",
    "Explain why any number divisible by {a} and {b} is divisible by their least common multiple.",
    "How many minutes are there in {a} days?",
    "Round {num}.{den} to the nearest whole number and explain.",
    "Is {big} a prime number? Explain how you check.",
    "Find the slope of the line through ({a}, {b}) and ({c}, {d}).",
    "Write {num}/{den} as a decimal and as a percentage.",
    "Compute {a}! and explain what a factorial is.",
    "Prove by induction that 1 + 2 + ... + n = n(n + 1)/2.",
    "Find the sum of the geometric series {a} + {a}*{e} + ... with {b} terms.",
    "What is the expected value of one roll of a fair {s2}-sided die?",
    "Convert {big} from base 10 to base {e}.",
    "A recipe needs {a} eggs for {b} people. How many eggs for {c} people?",
    "Find the median of {a}, {c}, {b}, {d}, {big}.",
    "Solve the inequality {a}x - {b} > {c}.",
    "Find the distance between ({a}, {b}) and ({c}, {d}).",
    "What is the sum of the interior angles of a polygon with {s} sides?",
    "Find x if {a}^x = {a}^{e} * {a}^{b}.",
    "A price rises by {c}% and then falls by {c}%. Is it back where it started? Explain.",
    "How many ways can {e} people sit in a row of {e} chairs?",
    "Simplify ({a}x^2 * {b}x^3) / ({c}x^4).",
    "Find the vertex of the parabola y = x^2 - {s}x + {p}.",
    "Show that {big} is divisible by 3 without dividing.",
)

GENERAL_TOPICS = (
    "volcanoes",
    "photosynthesis",
    "the water cycle",
    "black holes",
    "the French Revolution",
    "honeybees",
    "electric cars",
    "the human heart",
    "coffee",
    "the Roman Empire",
    "solar panels",
    "sleep",
    "recycling",
    "the moon landing",
    "earthquakes",
    "vaccines",
    "the internet",
    "climate change",
    "chess",
    "gardening",
    "the ocean tides",
    "dinosaurs",
    "the printing press",
    "meditation",
    "rainforests",
    "the stock market",
    "learning a new language",
    "public speaking",
    "time management",
    "healthy breakfast ideas",
    "the Olympic games",
    "jazz music",
    "the pyramids of Egypt",
    "penguins",
    "wind turbines",
    "friendship",
    "cloud computing",
    "the immune system",
    "bread baking",
    "renewable energy",
    "the Great Wall of China",
    "octopuses",
    "saving money",
    "running a marathon",
    "birds migrating",
    "the Renaissance",
    "glaciers",
    "bicycles",
    "board games",
    "the solar system",
    "artificial intelligence",
    "tea ceremonies",
    "museums",
    "deserts",
    "the history of writing",
    "trains",
    "volunteering",
    "camping",
    "electricity",
    "bees and flowers",
    "the invention of the telephone",
    "cooking pasta",
    "mountain climbing",
    "libraries",
    "the Northern Lights",
    "recycling plastic",
    "job interviews",
    "moving to a new city",
    "adopting a dog",
    "caring for houseplants",
    "learning to swim",
    "the seasons",
    "lightning",
    "whales",
    "coral reefs",
    "the printing of money",
    "city parks",
    "photography",
    "knitting",
    "the first computers",
    "space telescopes",
    "fossils",
    "kites",
    "learning to cook",
    "a road trip",
    "a broken laptop",
    "a noisy flat",
    "planting a vegetable garden",
    "writing a CV",
    "asking for a raise",
    "a school science fair",
    "a family reunion",
    "buying a first car",
    "the history of chocolate",
    "volcanic islands",
    "the Silk Road",
    "the human brain",
    "sharks",
    "tornadoes",
    "the Industrial Revolution",
    "democracy",
    "money and banks",
    "the speed of light",
    "tides and the moon",
    "a power cut at night",
    "a lost wallet",
    "a museum visit",
    "starting a small business",
    "a wedding toast",
    "a thank-you note",
    "a complaint to a landlord",
    "a holiday in the mountains",
    "composting",
    "owls",
    "the Vikings",
    "ancient Greece",
    "airplanes and flight",
    "submarines",
    "the first cars",
    "hurricanes",
    "a birthday party",
    "a job offer",
    "a new neighbour",
    "good study habits",
    "a healthy morning routine",
    "reading more books",
    "a city at night",
    "a train journey",
)
GENERAL_FORMS = (
    "Explain {topic} to a ten-year-old.",
    "Write a short paragraph about {topic}.",
    "Give me five interesting facts about {topic}.",
    "What are the pros and cons of {topic}?",
    "Write a short poem about {topic}.",
    "Summarise the history of {topic} in a few sentences.",
    "Give three tips for someone who is new to {topic}.",
    "Write a friendly email to a friend about {topic}.",
    "Describe {topic} in simple words.",
    "Why is {topic} important? Answer in a short paragraph.",
    "Write a short story opening that involves {topic}.",
    "List some common misconceptions about {topic}.",
    "How would you explain {topic} to someone from the 1800s?",
    "Write a haiku about {topic}.",
    "What questions should I ask to learn more about {topic}?",
    "Compare {topic} and {topic2} briefly.",
    "Explain {topic} and why it matters, in plain words.",
    "Give me a list of ideas related to {topic}.",
    "Write a limerick about {topic}.",
    "Give step-by-step advice on {topic}.",
    "Tell me something surprising about {topic}.",
    "Write a diary entry from someone experiencing {topic}.",
    "Describe a typical day involving {topic}.",
)

# Meta-prompts: the target writes its own questions (sampled), so the corpus is not only our templates.
META_FORMS = {
    "code": (
        "Write one short programming question about {concept} that a student might ask. Reply with the question only.",
        "Write one request a developer might make to get {lang} code for a task involving {concept}. Reply with the request only.",
        "Write one coding exercise about {concept} in {lang}. Reply with the exercise only.",
        # tasks from any topic, not from CODE_TASKS: the draft transfers poorly to tasks it has not seen
        # (study/results/real3/transfer-code.json), and the target can write far more of them than a list holds
        "Write one request a user might make for a small {lang} program about {topic}. Reply with the request only.",
        "Write one task for a {lang} function that works on data about {topic}; name its inputs and its output. "
        "Reply with the task only.",
    ),
    "math": (
        "Write one short math word problem about {topic} with numbers in it. Reply with the problem only.",
        "Write one algebra or geometry exercise with numbers in it. Reply with the exercise only.",
        "Write one probability or statistics question about {topic}. Reply with the question only.",
    ),
    "general": (
        "Write one interesting question someone might ask about {topic}. Reply with the question only.",
        "Write one request a person might make to an assistant about {topic}, such as an email, a plan or a list. Reply with the request only.",
        "Write one question a curious child might ask about {topic}. Reply with the question only.",
    ),
}


def _trigrams(text: str) -> set[tuple[str, ...]]:
    words = re.findall(r"[a-z0-9]+", text.lower())
    return {tuple(words[i : i + 3]) for i in range(len(words) - 2)}


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
        "code": lambda: dict(
            lang=rng.choice(LANGS),
            task=rng.choice(CODE_TASKS),
            concept=rng.choice(CONCEPTS),
            concept2=rng.choice(CONCEPTS),
            sql=rng.choice(SQL_TASKS),
        ),
        "math": lambda: dict(
            a=rng.randint(2, 19),
            b=rng.randint(2, 29),
            c=rng.randint(2, 40),
            d=rng.randint(1, 30),
            e=rng.randint(2, 6),
            s=rng.randint(3, 15),
            p=rng.randint(2, 50),
            s2=rng.randint(2, 12),
            big=rng.randint(40, 960),
            big2=rng.randint(40, 960),
            num=rng.randint(2, 99),
            den=rng.randint(2, 99),
            h=rng.randint(6, 20),
            m=rng.randint(0, 5),
            per=2 * rng.randint(10, 40),
            area=rng.randint(20, 300),
            prime=rng.choice((3, 5, 7, 11, 13)),
        ),
        "general": lambda: dict(topic=rng.choice(GENERAL_TOPICS), topic2=rng.choice(GENERAL_TOPICS)),
    }
    cats = list(forms)
    tries = 0
    while len(out) < n and tries < n * 50:
        tries += 1
        cat = cats[len(out) % len(cats)]
        if rng.random() < specific:
            text, group = SPECIFIC[cat](rng, GENERAL_TOPICS)
        else:
            k = rng.randrange(len(forms[cat]))
            form, values = forms[cat][k], fill[cat]()
            subject = next((values[key] for key in SUBJECT_KEYS if "{" + key + "}" in form), "")
            text, group = form.format(**values), group_name(f"{cat}:{k}", subject)
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
        out.append(
            TrainPrompt(
                cat,
                META_FORMS[cat][k].format(
                    concept=rng.choice(CONCEPTS), lang=rng.choice(LANGS), topic=rng.choice(GENERAL_TOPICS)
                ),
                f"self-{cat}:{k}",
            )
        )
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
