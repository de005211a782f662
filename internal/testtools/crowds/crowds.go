// Package crowds is a test tool: it publishes the script of a bot-made
// trend, the case trending by contributors is for. Over a steady
// background of 40 topics mentioned by 1,000 contributors, three
// contributors flood one topic with 30,000 mentions while 400 contributors
// mention another twice each. Ranked by mentions the flood is first; ranked
// by contributors the organic topic is, and the flood is not listed.
package crowds

import (
	"fmt"
	"time"
)

// The script's topics.
const (
	Flood   = "flood"
	Organic = "organic"
)

// Script sizes.
const (
	floodBy      = 3
	floodEach    = 10_000
	organicBy    = 400
	organicEach  = 2
	background   = 40
	backgroundBy = 1_000
	// History is how many minutes of background come before now's
	// minute: a 5-minute window and its 20-minute baseline.
	History = 24
)

// Publisher publishes one mention message: its subject and payload.
type Publisher func(subject string, payload []byte) error

// Script publishes the script under prefix ("mentions.") at now: the
// background, each of its 40 topics mentioned once a minute by its own 25
// contributors over the History minutes before now's and in now's (each
// mention stamped with its minute's "at"), then the flood and the organic
// topic, stamped now. It returns the mentions published per topic.
func Script(publish Publisher, prefix string, now time.Time) (map[string]int64, error) {
	sent := make(map[string]int64)
	send := func(topic string, who int, at time.Time) error {
		payload := fmt.Appendf(nil, `{"count":1,"at":%d,"by":"c%d"}`, at.UnixMilli(), who)
		if err := publish(prefix+topic, payload); err != nil {
			return err
		}
		sent[topic]++
		return nil
	}
	per := backgroundBy / background
	for m := History; m >= 0; m-- {
		at := now.Add(-time.Duration(m) * time.Minute)
		for topic := range background {
			for k := range per {
				if err := send(Background(topic), topic*per+k, at); err != nil {
					return sent, err
				}
			}
		}
	}
	for range floodEach {
		for who := range floodBy {
			if err := send(Flood, backgroundBy+who, now); err != nil {
				return sent, err
			}
		}
	}
	for range organicEach {
		for who := range organicBy {
			if err := send(Organic, backgroundBy+floodBy+who, now); err != nil {
				return sent, err
			}
		}
	}
	return sent, nil
}

// Background is the background's topic i.
func Background(i int) string { return fmt.Sprintf("steady-%02d", i) }

// OrganicContributors is how many contributors mention the organic
// topic.
const OrganicContributors = organicBy
