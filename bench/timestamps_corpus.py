"""Sentences for bench/timestamps.py: plain text, numbers, money, times, dates, abbreviations, names.

`sentences(count)`: the hand-written ones first, then ones made from templates with a fixed seed, so
every run reads the same text.
"""

from __future__ import annotations

import random

WRITTEN = [
    "Dr. Smith paid $3.50 on 3/4 at 7:30 p.m.",
    "The train leaves the station at seven.",
    "Mr. Patel moved to 42 Baker St. in 2019.",
    "Please close the window before you go to bed.",
    "Our flight to Boston departs at 6:45 a.m. tomorrow.",
    "The invoice came to $1,250 including tax.",
    "Maria and Jonathan met in Lisbon last summer.",
    "Could you send me the report by Friday afternoon?",
    "About 25% of the tickets were sold in the first hour.",
    "Prof. Nakamura gave a lecture on black holes.",
    "The package weighs 12 kg and measures 40 cm across.",
    "We walked along the beach until the sun went down.",
    "Call me at 555-0199 when you land.",
    "The meeting moved from Tuesday to Thursday at 10:15.",
    "Sgt. Rivera thanked the volunteers for their help.",
    "Thank you for calling, how can I help you today?",
    "A coffee costs $4.75 at the corner cafe.",
    "The museum opens at ten and closes at six.",
    "On March 3rd, 1999, the bridge finally opened.",
    "Ms. Okafor teaches chemistry at the high school.",
    "He forgot his umbrella and got soaked in the rain.",
    "The recipe needs 2 cups of flour and 3 eggs.",
    "Turn left at the bakery and keep going straight.",
    "Gov. Lindqvist signed the bill on Monday.",
    "The temperature dropped to 5 degrees overnight.",
    "She plays the piano every evening after dinner.",
    "Room 214 is on the second floor, next to the lifts.",
    "I think the meeting was moved to Thursday.",
    "The score was 3 to 1 after ninety minutes.",
    "Fresh bread smells wonderful early in the morning.",
    "Rev. Thompson will lead the service at 11 a.m.",
    "The package should arrive within three business days.",
    "Sophie bought 6 apples and 4 pears for $7.20.",
    "Let me know if you need anything else from the store.",
    "The children built a snowman in the garden.",
    "Capt. Alvarez steered the ship through the storm.",
    "Your order number is 48213, printed on the receipt.",
    "The flight was delayed because of heavy fog over the airport.",
    "Don't forget to water the plants while I'm away.",
    "The river flooded the fields after a week of storms.",
    "Lt. Chen reported for duty at 0600 hours.",
    "Please hold the line while I transfer your call.",
    "Learning a new language takes patience and practice.",
    "The concert tickets cost $85 each, so we bought two.",
    "Dr. Fischer and Dr. Moreau published the study together.",
    "We should leave early to avoid the traffic on the bridge.",
    "Every seat in the theater was taken on opening night.",
    "The battery is at 15%, so plug in the charger soon.",
    "Is there a pharmacy near the central square?",
    "Mrs. O'Brien has lived on Elm Street for 30 years.",
    "I would like a table for four people at eight o'clock.",
    "The update fixed 17 bugs and improved battery life.",
    "Remember to bring your passport and a copy of your ticket.",
    "Sales grew by 8% during the last quarter of the year.",
    "Can you recommend a good book for a long flight?",
    "The bus was crowded, so we decided to walk home instead.",
    "Aunt Beatrice turned 90 on Saturday.",
    "The printer on the second floor is out of paper.",
    "Good ideas often come when you least expect them.",
    "The orchestra tuned their instruments before the concert began.",
]

NAMES = ["Alice", "Rahul", "Ingrid", "Mateo", "Chloe", "Kwame", "Yuki", "Oliver", "Fatima", "Lucas", "Hannah", "Diego"]
TITLES = ["Dr.", "Mr.", "Mrs.", "Ms.", "Prof."]
SURNAMES = ["Garcia", "Kowalski", "Nguyen", "Brennan", "Haddad", "Larsen", "Okoro", "Silva", "Whitaker", "Tanaka"]
PLACES = ["Denver", "Glasgow", "Nairobi", "Osaka", "Toronto", "Valencia", "Dublin", "Seattle", "Melbourne", "Lyon"]
THINGS = ["a bicycle", "two lamps", "a red coat", "some paint", "a used car", "three chairs", "a new phone", "a kettle"]
TEMPLATES = [
    "{name} flew to {place} on {month} {day}.",
    "{title} {surname} paid ${dollars}.{cents:02d} for {thing}.",
    "The meeting with {title} {surname} starts at {hour}:{minute:02d} p.m.",
    "{name} sold {thing} for ${dollars} last week.",
    "Around {percent}% of people in {place} cycle to work.",
    "{name} and {other} ran {km} km before breakfast.",
    "The shop on {number} Main St. closes at {hour} o'clock.",
    "{title} {surname} will call you back in {minutes} minutes.",
    "In {year}, {name} moved from {place} to {other_place}.",
    "We need {count} boxes and {more} rolls of tape by Friday.",
]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October"]


def sentences(count: int) -> list[str]:
    out = WRITTEN[:count]
    draw = random.Random(42)
    while len(out) < count:
        name, other = draw.sample(NAMES, 2)
        place, other_place = draw.sample(PLACES, 2)
        out.append(
            draw.choice(TEMPLATES).format(
                name=name,
                other=other,
                place=place,
                other_place=other_place,
                title=draw.choice(TITLES),
                surname=draw.choice(SURNAMES),
                thing=draw.choice(THINGS),
                month=draw.choice(MONTHS),
                day=draw.randint(1, 28),
                dollars=draw.randint(2, 900),
                cents=draw.randint(1, 99),
                hour=draw.randint(1, 11),
                minute=draw.randint(10, 59),
                percent=draw.randint(5, 80),
                km=draw.randint(3, 20),
                number=draw.randint(10, 300),
                minutes=draw.randint(5, 45),
                year=draw.randint(1990, 2023),
                count=draw.randint(3, 30),
                more=draw.randint(2, 9),
            )
        )
    return out
