"""Evaluation tasks with checkable answers for the parity gate.

The gate compares the fast tier with the standard tier task by task (a paired test), so the
suite must be large enough that one task flipping moves the score by less than 1%: the tasks
are generated from parameter tables (never from the global random module or ``hash()``), so
the list is the same on every run and every machine.

The families are the things SmolLM2-135M-Instruct, the model under test, can sometimes do:
very short Python functions (judged by running an assert-based test), copying text, changing
its case, following an answer format, one-digit arithmetic, next-in-sequence questions and
very famous capitals. Tasks it always fails or always passes carry no information about a
quantized copy, so each family mixes easier and harder items.

Every task carries a ``reference``: a correct answer (for code tasks, a correct function),
which the unit tests use to prove each check accepts the right answer and rejects wrong ones.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

CheckFn = Callable[[str], bool]


@dataclass(frozen=True)
class Task:
    name: str
    kind: str
    prompt: str
    check: CheckFn
    # Code tasks: a test appended to the model's code and run in the sandbox.
    test: str | None = None
    # A short answer fits in a few tokens even with a preamble; code tasks ask for 112 (a
    # one-function answer with its fences fits; what follows is explanation, not code).
    # Every token here is paid twice per candidate when tuning on two cores.
    max_tokens: int = 24
    # A correct answer (for code tasks, a correct function): the unit tests' ground truth.
    reference: str = ""


def code_of(text: str) -> str:
    match = re.search(r"```(?:python)?\n(.*?)```", text, re.S)
    return match.group(1) if match else text


def _table(text: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in text.split(","))


# Answers are graded like a lenient human would: surrounding whitespace, quotes, markdown
# emphasis and final punctuation do not matter; the content itself must be right.
_EDGE = " \t\r\n.!?\"'`*"
_NUMBER_WORDS = _table(
    "zero, one, two, three, four, five, six, seven, eight, nine, ten, eleven, twelve, "
    "thirteen, fourteen, fifteen, sixteen, seventeen, eighteen, nineteen, twenty"
)


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text.strip(_EDGE)).lower()


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def _exact(answer: str) -> CheckFn:
    return lambda text: _norm(text) == answer.lower()


def _copied(phrase: str) -> CheckFn:
    target = f" {' '.join(_words(phrase))} "
    return lambda text: target in f" {' '.join(_words(text))} "


def _cased(target: str) -> CheckFn:
    # Case is the content of a case transform, so this match is case-sensitive.
    pattern = re.compile(rf"(?<![A-Za-z]){re.escape(target)}(?![A-Za-z])")
    return lambda text: pattern.search(" ".join(text.split())) is not None


def _number(expected: int) -> CheckFn:
    # The last number is the answer: "3 + 4 = 7" and "The answer is seven." both pass.
    def check(text: str) -> bool:
        tokens = re.findall(r"\d+|[a-z]+", text.lower())
        values = [
            int(t) if t.isdigit() else _NUMBER_WORDS.index(t)
            for t in tokens
            if t.isdigit() or t in _NUMBER_WORDS
        ]
        return bool(values) and values[-1] == expected

    return check


def _one_of(expected: str, vocabulary: Sequence[str], allowed: str = "") -> CheckFn:
    # Naming the right item is not enough: naming another one too ("Tuesday or Wednesday")
    # fails, except the item the question itself mentions.
    def check(text: str) -> bool:
        named = [w for w in _words(text) if w in vocabulary]
        return expected in named and all(w in (expected, allowed) for w in named)

    return check


def _letter(expected: str) -> CheckFn:
    def check(text: str) -> bool:
        singles = {t.lower() for t in re.findall(r"[A-Za-z]+", text) if len(t) == 1}
        # "a" and "I" are words, not answers ("The first letter is a B").
        return expected in singles and singles <= {expected, "a", "i"}

    return check


def _json_has(key: str, value: object) -> CheckFn:
    def check(text: str) -> bool:
        match = re.search(r"\{.*?\}", text, re.S)
        if not match:
            return False
        try:
            return bool(json.loads(match.group(0)).get(key) == value)
        except (json.JSONDecodeError, AttributeError):
            return False

    return check


def _defines(function: str) -> CheckFn:
    pattern = re.compile(rf"def\s+{function}\s*\(")
    return lambda text: pattern.search(code_of(text)) is not None


def _slug(text: str) -> str:
    return "_".join(_words(text)[:3])


Row = tuple[str, str, CheckFn, str]  # slug, prompt, check, reference


def _family(family: str, kind: str, rows: Sequence[Row]) -> list[Task]:
    # The first task of a family keeps the family's bare name, which is what the suite's
    # earlier hand-written tasks were called, so older reports stay comparable.
    return [
        Task(family if i == 0 else f"{family}_{slug}", kind, prompt, check, reference=ref)
        for i, (slug, prompt, check, ref) in enumerate(rows)
    ]


# Each function: "signature | what it returns | a correct one-line body", then its test.
# Every test rejects a function that returns None and one that returns its first argument.
_FUNCTIONS = """
add(a, b) | the sum of a and b | a + b
    assert add(2, 3) == 5 and add(-1, 1) == 0
subtract(a, b) | a minus b | a - b
    assert subtract(7, 2) == 5 and subtract(1, 4) == -3
multiply(a, b) | the product of a and b | a * b
    assert multiply(3, 4) == 12 and multiply(0, 5) == 0
square(x) | x squared | x * x
    assert square(4) == 16 and square(-3) == 9
cube(x) | x cubed | x ** 3
    assert cube(2) == 8 and cube(-3) == -27
double(x) | twice x | 2 * x
    assert double(4) == 8 and double(-2) == -4
half(x) | x divided by 2 | x / 2
    assert half(10) == 5 and half(3) == 1.5
increment(n) | n plus one | n + 1
    assert increment(4) == 5 and increment(-1) == 0
decrement(n) | n minus one | n - 1
    assert decrement(4) == 3 and decrement(0) == -1
negate(x) | x with its sign flipped | -x
    assert negate(5) == -5 and negate(-2) == 2
absolute(x) | the absolute value of x | abs(x)
    assert absolute(-4) == 4 and absolute(3) == 3
power(base, exp) | base raised to the power exp | base ** exp
    assert power(2, 3) == 8 and power(5, 0) == 1
remainder(a, b) | the remainder of a divided by b | a % b
    assert remainder(7, 3) == 1 and remainder(9, 3) == 0
max_of_two(a, b) | the larger of a and b | max(a, b)
    assert max_of_two(3, 8) == 8 and max_of_two(9, 2) == 9
min_of_two(a, b) | the smaller of a and b | min(a, b)
    assert min_of_two(3, 8) == 3 and min_of_two(9, 2) == 2
factorial(n) | the factorial of n | 1 if n == 0 else n * factorial(n - 1)
    assert factorial(5) == 120 and factorial(0) == 1
sum_to(n) | the sum of the integers from 1 to n | n * (n + 1) // 2
    assert sum_to(4) == 10 and sum_to(1) == 1
sign(n) | 1 if n is positive, -1 if n is negative and 0 if n is zero | (n > 0) - (n < 0)
    assert sign(5) == 1 and sign(-3) == -1 and sign(0) == 0
celsius_to_fahrenheit(c) | c degrees Celsius in degrees Fahrenheit | c * 9 / 5 + 32
    assert celsius_to_fahrenheit(0) == 32 and celsius_to_fahrenheit(100) == 212
area_of_rectangle(width, height) | the area of a rectangle | width * height
    assert area_of_rectangle(3, 4) == 12
perimeter_of_square(side) | the perimeter of a square with that side | 4 * side
    assert perimeter_of_square(3) == 12
is_even(n) | True if n is even, else False | n % 2 == 0
    assert is_even(4) and not is_even(7)
is_odd(n) | True if n is odd, else False | n % 2 == 1
    assert is_odd(3) and not is_odd(8)
is_positive(n) | True if n is greater than zero, else False | n > 0
    assert is_positive(5) and not is_positive(-2) and not is_positive(0)
is_negative(n) | True if n is less than zero, else False | n < 0
    assert is_negative(-1) and not is_negative(3)
is_divisible(a, b) | True if a is divisible by b, else False | a % b == 0
    assert is_divisible(10, 5) and not is_divisible(7, 2)
is_adult(age) | True if age is 18 or more, else False | age >= 18
    assert is_adult(18) and is_adult(30) and not is_adult(17)
largest(numbers) | the largest number in a list | max(numbers)
    assert largest([3, 9, 2]) == 9
smallest(numbers) | the smallest number in a list | min(numbers)
    assert smallest([4, 1, 7]) == 1
total(numbers) | the sum of the numbers in a list | sum(numbers)
    assert total([1, 2, 3]) == 6 and total([]) == 0
average(numbers) | the average of the numbers in a list | sum(numbers) / len(numbers)
    assert average([2, 4, 6]) == 4
count_items(items) | the number of items in a list | len(items)
    assert count_items([1, 2, 3]) == 3 and count_items([]) == 0
first_item(items) | the first element of a list | items[0]
    assert first_item([5, 6, 7]) == 5
last_item(items) | the last element of a list | items[-1]
    assert last_item([5, 6, 7]) == 7
sort_list(numbers) | the list sorted in ascending order | sorted(numbers)
    assert sort_list([3, 1, 2]) == [1, 2, 3]
unique_sorted(numbers) | the distinct values of a list, sorted | sorted(set(numbers))
    assert unique_sorted([3, 1, 3, 2, 1]) == [1, 2, 3]
even_numbers(numbers) | a list of the even numbers in a list | [n for n in numbers if n % 2 == 0]
    assert even_numbers([1, 2, 3, 4]) == [2, 4]
double_all(numbers) | a list with every number doubled | [2 * n for n in numbers]
    assert double_all([1, 2, 3]) == [2, 4, 6]
square_all(numbers) | a list with every number squared | [n * n for n in numbers]
    assert square_all([1, 2, 3]) == [1, 4, 9]
count_positive(numbers) | how many numbers in a list are above zero | sum(n > 0 for n in numbers)
    assert count_positive([1, -2, 3, 0]) == 2
contains(items, x) | True if x is in the list items, else False | x in items
    assert contains([1, 2, 3], 2) and not contains([1, 2, 3], 5)
is_empty(items) | True if the list is empty, else False | len(items) == 0
    assert is_empty([]) and not is_empty([1])
reverse_string(s) | the string reversed | s[::-1]
    assert reverse_string('abc') == 'cba'
to_upper(s) | the string in uppercase | s.upper()
    assert to_upper('abc') == 'ABC'
to_lower(s) | the string in lowercase | s.lower()
    assert to_lower('HeLLo') == 'hello'
swap_case(s) | the string with the case of every letter swapped | s.swapcase()
    assert swap_case('aBc') == 'AbC'
capitalize_word(word) | the word with its first letter in uppercase | word.capitalize()
    assert capitalize_word('python') == 'Python'
string_length(s) | the number of characters in the string | len(s)
    assert string_length('hello') == 5 and string_length('') == 0
first_char(s) | the first character of the string | s[0]
    assert first_char('hello') == 'h'
last_char(s) | the last character of the string | s[-1]
    assert last_char('hello') == 'o'
repeat_string(s, n) | the string s repeated n times | s * n
    assert repeat_string('ab', 3) == 'ababab'
concat(a, b) | the string a followed by the string b | a + b
    assert concat('foo', 'bar') == 'foobar'
count_vowels(s) | the number of vowels (a, e, i, o, u) in s | sum(ch in 'aeiou' for ch in s)
    assert count_vowels('banana') == 3 and count_vowels('xyz') == 0
count_char(s, c) | how many times the character c appears in s | s.count(c)
    assert count_char('banana', 'a') == 3 and count_char('kiwi', 'z') == 0
word_count(s) | the number of words in the string | len(s.split())
    assert word_count('the quick brown fox') == 4 and word_count('hi') == 1
is_palindrome(s) | True if s reads the same backwards, else False | s == s[::-1]
    assert is_palindrome('level') and not is_palindrome('hello')
is_vowel(ch) | True if the letter ch is a vowel, else False | ch in 'aeiou'
    assert is_vowel('a') and not is_vowel('b')
greet(name) | the string 'Hello, ' followed by name | 'Hello, ' + name
    assert greet('Ann') == 'Hello, Ann'
join_words(words) | the words of a list joined with single spaces | ' '.join(words)
    assert join_words(['hi', 'there']) == 'hi there'
"""


def _code_tasks() -> list[Task]:
    lines = _FUNCTIONS.strip().splitlines()
    tasks = []
    for header, test in zip(lines[::2], lines[1::2], strict=True):
        signature, returns, body = (part.strip() for part in header.split(" | "))
        function = signature.split("(")[0]
        tasks.append(
            Task(
                function,
                "code",
                f"Write a python function {signature} that returns {returns}.",
                _defines(function),
                test=test.strip(),
                max_tokens=112,
                reference=f"def {signature}:\n    return {body}\n",
            )
        )
    return tasks


def _ask(
    family: str,
    kind: str,
    templates: tuple[str, ...],
    pairs: Iterable[tuple[str, str]],
    check: Callable[[str, str], CheckFn],
) -> list[Task]:
    """One task per (asked, answer) pair; the prompt templates take turns."""
    rows = [
        (_slug(q), templates[i % len(templates)].format(q), check(q, a), a)
        for i, (q, a) in enumerate(pairs)
    ]
    return _family(family, kind, rows)


_PHRASES = _table(
    "the quick brown fox, hello world 123, good morning everyone, the cat sat on the mat, "
    "red green blue, one two three four, i like green apples, the sun is bright today, "
    "open the window please, coffee and tea, my dog likes to run, rain falls in spring, "
    "see you tomorrow, the river is long, seven blue birds, keep it simple, water is wet, "
    "bread and butter, turn left at the corner, stars shine at night"
)
_UPPER = _table(
    "hello world, good night, apple pie, blue sky, open the door, red car, "
    "happy birthday, green tea, big house, cold water"
)
_LOWER = _table(
    "GOOD MORNING, THANK YOU, BIG DOG, SUNNY DAY, HELLO THERE, OPEN BOOK, FAST TRAIN, "
    "NEW YEAR, SMALL CAT, DARK NIGHT"
)


def _text_tasks() -> list[Task]:
    copy = ("Repeat exactly: {}", "Repeat this text exactly: {}", "Copy this text: {}")
    upper = [(w, w.upper()) for w in _UPPER]
    lower = [(w, w.lower()) for w in _LOWER]
    return [
        *_ask("copy", "copy", copy, [(p, p) for p in _PHRASES], lambda q, a: _copied(a)),
        *_ask("upper", "transform", ("Convert to uppercase: {}",), upper, lambda q, a: _cased(a)),
        *_ask("lower", "transform", ("Convert to lowercase: {}",), lower, lambda q, a: _cased(a)),
    ]


_YES = (
    "Answer with only the word yes.",
    "Say yes. Answer with one word.",
    "Is this question written in English? Answer with only yes or no.",
    "Is water wet? Answer with only yes or no.",
)
_NO = (
    "Reply with just the word no, nothing else.",
    "Say no. Answer with one word.",
    "Is the number 3 bigger than the number 10? Answer with only yes or no.",
    "Can a fish ride a bicycle? Answer with only yes or no.",
)
_WORDS = _table("blue, apple, river, seven, happy, window")
_NUMBERS = _table("7, 42, 15, 3, 100")
_JSON = _table(
    "name Bob, city Paris, color red, animal dog, age 7, fruit apple, language python, count 3"
)


def _json_task(key: str, text: str) -> Row:
    value: str | int = int(text) if text.isdigit() else text
    shown = f"the number {value}" if isinstance(value, int) else json.dumps(value)
    prompt = f'Return a JSON object with a key "{key}" whose value is {shown}. Only the JSON.'
    return key, prompt, _json_has(key, value), json.dumps({key: value})


def _format_tasks() -> list[Task]:
    def exact(q: str, a: str) -> CheckFn:
        return _exact(a)

    word = ("Answer with only the word {}.",)
    number = ("Reply with only the number {}.",)
    return [
        *_ask("yes", "format", ("{}",), [(p, "yes") for p in _YES], exact),
        *_ask("no", "format", ("{}",), [(p, "no") for p in _NO], exact),
        *_ask("word", "format", word, [(w, w) for w in _WORDS], exact),
        *_ask("number", "format", number, [(n, n) for n in _NUMBERS], exact),
        *_family("json", "format", [_json_task(*pair.split()) for pair in _JSON]),
    ]


# Single-digit operands and answers: the most a 135M model sometimes gets right.
_SUMS = _table("2 2, 3 4, 1 5, 6 2, 4 4, 5 3, 7 1, 2 6, 8 1, 3 3, 1 2, 4 5, 6 3, 2 7, 5 4, 1 8")
_DIFFERENCES = _table("9 4, 7 2, 8 5, 6 1")


def _arithmetic_tasks() -> list[Task]:
    def number(q: str, a: str) -> CheckFn:
        return _number(int(a))

    plus = [(f"{a} plus {b}", str(int(a) + int(b))) for a, b in map(str.split, _SUMS)]
    minus = [(f"{a} minus {b}", str(int(a) - int(b))) for a, b in map(str.split, _DIFFERENCES)]
    asked = ("What is {}? Answer with only the number.", "Compute {}. Reply with just the number.")
    return [
        *_ask("sum", "arithmetic", asked, plus, number),
        *_ask("difference", "arithmetic", asked[:1], minus, number),
    ]


_DAYS = _table("Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday")
_MONTHS = _table(
    "January, February, March, April, May, June, July, August, September, October, November, "
    "December"
)


def _successors(items: Sequence[str], asked: Sequence[str]) -> list[tuple[str, str]]:
    return [(item, items[(items.index(item) + 1) % len(items)]) for item in asked]


def _sequence_tasks() -> list[Task]:
    def named(vocabulary: Sequence[str]) -> Callable[[str, str], CheckFn]:
        lowered = [v.lower() for v in vocabulary]
        return lambda q, a: _one_of(a.lower(), lowered, allowed=q.lower())

    days = _successors(_DAYS, _DAYS)
    months = _successors(_MONTHS, _table("January, March, May, July, October, December"))
    numbers = [(str(n), str(n + 1)) for n in (3, 7, 12, 19, 29, 99)]
    words = _table("banana, cat, dog, garden, house, moon, rabbit, water")
    letters = [(w, w[0].upper()) for w in words]
    day = ("What day of the week comes after {}? Answer with one word.",)
    month = ("What month comes after {}? Answer with one word.",)
    number = ("What number comes after {}? Answer with only the number.",)
    letter = ('What is the first letter of the word "{}"? Answer with only the letter.',)
    return [
        *_ask("next_day", "sequence", day, days, named(_DAYS)),
        *_ask("next_month", "sequence", month, months, named(_MONTHS)),
        *_ask("next_number", "sequence", number, numbers, lambda q, a: _number(int(a))),
        *_ask("first_letter", "sequence", letter, letters, lambda q, a: _letter(a.lower())),
    ]


_CAPITALS = _table(
    "France Paris, Japan Tokyo, Italy Rome, Germany Berlin, Spain Madrid, England London, "
    "Russia Moscow, China Beijing, Egypt Cairo, Greece Athens"
)


def _fact_tasks() -> list[Task]:
    pairs = [(country, city) for country, city in map(str.split, _CAPITALS)]
    cities = [city.lower() for _, city in pairs]
    asked = ("What is the capital of {}? Answer in one word.",)
    return _ask("capital", "fact", asked, pairs, lambda q, a: _one_of(a.lower(), cities))


def build_tasks() -> list[Task]:
    return [
        *_code_tasks(),
        *_text_tasks(),
        *_format_tasks(),
        *_arithmetic_tasks(),
        *_sequence_tasks(),
        *_fact_tasks(),
    ]


TASKS: list[Task] = build_tasks()
