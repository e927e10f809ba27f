"""A built-in prompt set for self-generated distillation data: chat-style instructions (in SmolLM2's ChatML template)
and the openings of short Python code snippets. Deterministic (no randomness, no downloads)."""

from __future__ import annotations

from accel.drafts.data import chat_prompt

__all__ = ["CHAT_INSTRUCTIONS", "CODE_STARTS", "DEFAULT_PROMPTS", "HELD_OUT_PROMPTS", "code_signatures"]

_TOPICS = (
    "photosynthesis",
    "the water cycle",
    "black holes",
    "the French Revolution",
    "machine learning",
    "volcanoes",
    "the immune system",
    "climate change",
    "the internet",
    "democracy",
    "electric cars",
    "the Moon",
    "honey bees",
    "compound interest",
    "recycling",
    "the Roman Empire",
    "earthquakes",
    "vaccines",
    "rainbows",
    "the stock market",
    "coffee",
    "sleep",
    "exercise",
    "solar panels",
    "the human heart",
    "dinosaurs",
    "gravity",
    "the printing press",
    "quantum computers",
    "the ocean tides",
)
_ASKS = (
    "Explain {} in simple terms.",
    "Write a short paragraph about {}.",
    "What are three interesting facts about {}?",
    "Give me a brief summary of {} for a ten-year-old.",
    "Why is {} important?",
)
_TASKS = (
    "Write a haiku about autumn.",
    "Give me five tips for staying productive when working from home.",
    "Write a polite email asking my manager for a day off next Friday.",
    "What is the difference between a list and a tuple in Python?",
    "How do I make a simple tomato pasta sauce?",
    "Suggest a name for a small bakery and explain why.",
    "Translate 'Good morning, how are you?' into French and Spanish.",
    "Write a short story about a robot who learns to paint.",
    "What should I pack for a weekend hiking trip?",
    "Explain what a recursive function is, with an example.",
    "How can I improve my public speaking skills?",
    "Write a limerick about a cat who loves to sleep.",
    "What are the benefits of reading books every day?",
    "Describe the plot of a mystery novel in three sentences.",
    "How does a hash table work?",
    "Give me a simple weekly workout plan for beginners.",
    "What is the capital of Australia, and what is it known for?",
    "Write a motivational message for a friend starting a new job.",
    "Explain the difference between weather and climate.",
    "List the planets of the solar system in order from the Sun.",
)
_CODE_TASKS = (
    "Write a Python function that checks whether a string is a palindrome.",
    "Write a Python function to compute the factorial of a number.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Write a Python function that counts the words in a text.",
    "Write a Python class for a simple bank account with deposit and withdraw methods.",
    "Write a Python function that merges two sorted lists.",
    "Write a Python function that removes duplicates from a list while keeping the order.",
    "Write a Python script that reads a CSV file and prints the average of a column.",
    "Write a Python function to check if a number is prime.",
    "Write a Python function that reverses the words in a sentence.",
    "Write a JavaScript function that returns the largest number in an array.",
    "Write a SQL query that selects the ten most recent orders from an orders table.",
    "Write a Python function that implements binary search.",
    "Write a Python function that flattens a nested list.",
    "Write a Python function that converts Celsius to Fahrenheit.",
)
_CODE_OPENINGS = (
    "def is_palindrome(s: str) -> bool:\n",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "import os\nimport sys\n\n\ndef main():\n",
    "class Stack:\n    def __init__(self):\n",
    "def binary_search(items, target):\n",
    "def read_lines(path):\n    with open(path) as f:\n",
    "import json\n\n\ndef load_config(path):\n",
    "def quicksort(arr):\n    if len(arr) <= 1:\n",
    "class Node:\n    def __init__(self, value, next=None):\n",
    "def count_words(text):\n    counts = {}\n",
    "from dataclasses import dataclass\n\n\n@dataclass\nclass Point:\n",
    "def merge_sorted(a, b):\n    result = []\n",
    "def celsius_to_fahrenheit(c):\n",
    "for i in range(1, 101):\n    if i % 15 == 0:\n",
    "def gcd(a, b):\n    while b:\n",
    "import math\n\n\ndef area_of_circle(radius):\n",
    "def flatten(nested):\n    out = []\n",
    "class Matrix:\n    def __init__(self, rows):\n        self.rows = rows\n\n    def transpose(self):\n",
    "def parse_args():\n    import argparse\n\n    parser = argparse.ArgumentParser(",
    "def is_prime(n):\n    if n < 2:\n        return False\n",
)

CHAT_INSTRUCTIONS: tuple[str, ...] = (
    tuple(a.format(t) for i, t in enumerate(_TOPICS) for a in _ASKS[i % 2 :: 2]) + _TASKS
)
CODE_STARTS: tuple[str, ...] = _CODE_OPENINGS

# every prompt as the model sees it: chat instructions (incl. code requests) in the chat template, code openings raw
DEFAULT_PROMPTS: tuple[str, ...] = (
    tuple(chat_prompt(q) for q in CHAT_INSTRUCTIONS) + tuple(chat_prompt(q) for q in _CODE_TASKS) + CODE_STARTS
)

# prompts kept out of DEFAULT_PROMPTS, for measuring a draft on text it was not trained on
HELD_OUT_PROMPTS: tuple[str, ...] = (
    chat_prompt("Explain how a rainbow forms."),
    chat_prompt("Write a Python function that returns the sum of the squares of a list of numbers."),
    chat_prompt("Give me three ideas for a birthday party."),
    chat_prompt("What is the difference between a compiler and an interpreter?"),
    "def bubble_sort(items):\n",
    "class Queue:\n    def __init__(self):\n",
    chat_prompt("Write a short poem about the sea."),
    "def word_frequencies(text):\n",
)


_VERBS = (
    "count",
    "find",
    "sort",
    "merge",
    "parse",
    "load",
    "save",
    "compute",
    "filter",
    "reverse",
    "validate",
    "format",
    "convert",
    "remove",
    "group",
    "normalize",
    "average",
    "split",
    "encode",
    "clean",
)
_NOUNS = (
    ("lines", "lines"),
    ("numbers", "numbers"),
    ("users", "users"),
    ("dates", "dates"),
    ("scores", "scores"),
    ("prices", "prices"),
    ("names", "names"),
    ("emails", "emails"),
    ("records", "records"),
    ("matrix", "matrix"),
    ("config", "path"),
    ("tokens", "text"),
    ("vowels", "text"),
    ("files", "directory"),
    ("temperatures", "values"),
)
_CLASSES = (
    "Stack",
    "LinkedList",
    "BankAccount",
    "Inventory",
    "Student",
    "Timer",
    "Cache",
    "Graph",
    "Matrix",
    "Vector",
    "ShoppingCart",
    "Library",
    "Counter",
    "Logger",
    "Rectangle",
    "Deck",
    "Game",
    "Person",
    "Car",
    "Tree",
)


def code_signatures() -> tuple[str, ...]:
    """Python openings for self-generated code data: ``def <verb>_<noun>(<arg>):`` for 20 verbs x 15 nouns and
    ``class <Name>:`` with an ``__init__`` for 20 class names (deterministic; none of ``HELD_OUT_PROMPTS``)."""
    defs = tuple(f"def {v}_{n}({a}):\n" for v in _VERBS for n, a in _NOUNS)
    classes = tuple(f"class {c}:\n    def __init__(self" for c in _CLASSES)
    return tuple(p for p in defs + classes if p not in HELD_OUT_PROMPTS)
