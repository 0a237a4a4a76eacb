package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Content is a message's content. Null marks JSON null (an assistant turn with only tool
// calls).
type Content struct {
	Text string
	Null bool
	// Parts are the content's parts of a type other than text (image_url, input_audio, file,
	// ...), as sent: an external engine reads them from the client's body, the embedded engine
	// checks them (it runs images and audio, and refuses the others).
	Parts []json.RawMessage
	// Media are the parts among Parts that kvmesh counts and hashes into the prompt's prefix
	// chain, images and audio clips, in order, each with its place in Text.
	Media []Media
}

// Part types kvmesh reads beyond text: an image (OpenAI's image_url part, whose URL may be a
// data: URI holding the image) and an audio clip (input_audio, base64 data in a format).
const (
	PartImage = "image_url"
	PartAudio = "input_audio"
)

// Media is an image or audio part of a message's content, as the prompt's prefix sees it.
type Media struct {
	// At is the offset in Content.Text where the part stood: the length of the text of the
	// parts before it.
	At int
	// Type is PartImage or PartAudio.
	Type string
	// Source is what identifies the part's content, as sent: an image's URL (a data: URI, the
	// image itself, base64-encoded) or an audio clip's base64 data.
	Source string
	// Detail is an image's image_url.detail ("low", "high", "auto" or absent); Format is an
	// audio clip's input_audio.format ("wav", "mp3", ...).
	Detail, Format string
}

// UnmarshalJSON accepts a string, null, or an array of parts, each an object with a string
// type; a text part's text must be a string, an image_url part's image_url an object with a
// string url, an input_audio part's input_audio an object with string data.
func (c *Content) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	switch {
	case bytes.Equal(b, []byte("null")):
		*c = Content{Null: true}
		return nil
	case len(b) > 0 && b[0] == '"':
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		*c = Content{Text: s}
		return nil
	case len(b) > 0 && b[0] == '[':
		var raw []json.RawMessage
		if err := json.Unmarshal(b, &raw); err != nil {
			return errContent
		}
		return c.parts(raw)
	}
	return errContent
}

// parts fills c from an array content's parts.
func (c *Content) parts(raw []json.RawMessage) error {
	var sb strings.Builder
	var parts []json.RawMessage
	var media []Media
	for j, r := range raw {
		typ := PartType(r)
		switch typ {
		case "":
			return errContent
		case "text":
			var p ContentPart
			if json.Unmarshal(r, &p) != nil {
				return errContent
			}
			sb.WriteString(p.Text)
			continue
		case PartImage, PartAudio:
			m, err := decodeMedia(typ, r)
			if err != nil {
				return inField(fmt.Sprintf("[%d]", j), err)
			}
			m.At = sb.Len()
			media = append(media, m)
		}
		parts = append(parts, r)
	}
	*c = Content{Text: sb.String(), Parts: parts, Media: media}
	return nil
}

// decodeMedia reads an image or audio part's source.
func decodeMedia(typ string, r json.RawMessage) (Media, error) {
	if typ == PartImage {
		var p struct {
			ImageURL *struct {
				URL    *string `json:"url"`
				Detail string  `json:"detail"`
			} `json:"image_url"`
		}
		if json.Unmarshal(r, &p) != nil || p.ImageURL == nil || p.ImageURL.URL == nil {
			return Media{}, inField(PartImage, errImagePart)
		}
		return Media{Type: typ, Source: *p.ImageURL.URL, Detail: p.ImageURL.Detail}, nil
	}
	var p struct {
		InputAudio *struct {
			Data   *string `json:"data"`
			Format string  `json:"format"`
		} `json:"input_audio"`
	}
	if json.Unmarshal(r, &p) != nil || p.InputAudio == nil || p.InputAudio.Data == nil {
		return Media{}, inField(PartAudio, errAudioPart)
	}
	return Media{Type: typ, Source: *p.InputAudio.Data, Format: p.InputAudio.Format}, nil
}

// MarshalJSON writes the flattened text (or null), or, with Parts, an array of one text part
// (when there is text) and the parts.
func (c Content) MarshalJSON() ([]byte, error) {
	switch {
	case c.Null:
		return []byte("null"), nil
	case len(c.Parts) == 0:
		return json.Marshal(c.Text)
	}
	out := []byte{'['}
	if c.Text != "" {
		t, _ := json.Marshal(ContentPart{Type: "text", Text: c.Text})
		out = append(append(out, t...), ',')
	}
	for _, p := range c.Parts {
		out = append(append(out, p...), ',')
	}
	out[len(out)-1] = ']'
	return out, nil
}

// Text returns the message's flattened text content ("" for null).
func (m Message) Text() string { return m.Content.Text }

// ContentPart is one element of an array content.
type ContentPart struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// PartType returns a content part's type: "" when it is not an object with a string type.
func PartType(part json.RawMessage) string {
	var p struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(part, &p) != nil {
		return ""
	}
	return p.Type
}

var (
	errContent = errors.New("content must be a string or an array of parts, each an object with a string type " +
		"(a text part's text a string)")
	errImagePart = errors.New("an image_url part holds image_url, an object with url, a string " +
		"(an http(s) URL or a data: URI), and optionally detail, a string")
	errAudioPart = errors.New("an input_audio part holds input_audio, an object with data, a base64 string, " +
		"and optionally format, a string")
)
