# docs/ru/directives.md is docs/directives.md in Russian, and README.ru.md
# gives README.md's commands: this keeps them from drifting apart. Every
# directive and every variable of the English page has its section in the
# Russian one, in the same order, under the same heading; a directive's
# Syntax/Default/Context block is the same code (Синтаксис/Умолчание/
# Контекст); each section keeps the English one's code blocks to the letter,
# every `code` span (values, parameters, log lines), and its links, written
# from docs/ru/. So a change to the English page that the Russian one does
# not follow fails here, naming the section and what it lacks.
use strict;
use warnings;
use utf8;
use Test::More;

binmode $_, ':encoding(UTF-8)'
    for map { Test::More->builder->$_ } qw(output failure_output todo_output);

sub slurp {
    my ($file) = @_;
    open my $fh, '<:encoding(UTF-8)', $file or return undef;
    local $/;
    return <$fh>;
}

# The page's "##" and "###" sections in order, each {level, head, body};
# the part before the first heading is the section with an empty head.
# Headings inside fenced blocks are code, not headings.
sub sections {
    my ($text) = @_;
    my @s = ({ level => 1, head => '', body => '' });
    my $fence = 0;
    for my $line (split /^/, $text) {
        $fence = !$fence if $line =~ /^\s*```/;
        if (!$fence && $line =~ /^(##+)\s+(.*?)\s*$/) {
            push @s, { level => length $1, head => $2, body => '' };
            next;
        }
        $s[-1]{body} .= $line;
    }
    return @s;
}

# a heading that must be the same in both languages: a directive, a variable
sub named { return $_[0] =~ /^(?:idempotency\w*|`\$idempotency\w*`)$/ }
sub is_directive { return $_[0] =~ /^idempotency\w*$/ }

sub fences {
    my ($body) = @_;
    return $body =~ /^[ \t]*(```.*?^[ \t]*```)[ \t]*$/msg;
}

# inline code spans outside fenced blocks, whitespace folded (a span may be
# wrapped across lines differently in each language)
sub spans {
    my ($body) = @_;
    $body =~ s/^[ \t]*```.*?^[ \t]*```[ \t]*$//msg;
    my %s;
    while ($body =~ /`([^`]+)`/g) {
        (my $c = $1) =~ s/\s+/ /g;
        $s{$c} = 1;
    }
    return \%s;
}

sub links {
    my ($body) = @_;
    $body =~ s/^[ \t]*```.*?^[ \t]*```[ \t]*$//msg;
    $body =~ s/\s+/ /g;
    return $body =~ /\]\(([^)\s]+)\)/g;
}

# The directive block: Syntax (one or more lines), Default, Context.
sub block {
    my ($body, $syntax, $default, $context) = @_;
    my (%b, $in);
    for my $line (split /\n/, $body) {
        if ($line =~ /^    \Q$syntax\E:\s+(.*?)\s*$/) {
            $b{syntax} = [$1];
            $in = 1;
        } elsif ($in && $line =~ /^ {8,}(\S.*?)\s*$/) {
            push @{ $b{syntax} }, $1;
        } elsif ($line =~ /^    \Q$default\E:\s+(.*?)\s*$/) {
            $b{default} = $1;
            $in = 0;
        } elsif ($line =~ /^    \Q$context\E:\s+(.*?)\s*$/) {
            $b{context} = $1;
            last;
        }
    }
    return \%b;
}

# What of a default is code: the directive as written, or "—" for none;
# a default said in words ("the host of the address") is translated.
sub default_code {
    my ($name, $default) = @_;
    return undef unless defined $default;
    return $1 if $default =~ /^(\Q$name\E\b[^;]*;|—)/;
    return '';
}

my $en_text = slurp('docs/directives.md') or die "docs/directives.md: $!";
my $ru_text = slurp('docs/ru/directives.md');
ok(defined $ru_text, 'docs/ru/directives.md exists')
    or BAIL_OUT('no Russian page');

my @en = sections($en_text);
my @ru = sections($ru_text);
my %ru = map { named($_->{head}) ? ($_->{head} => $_) : () } @ru;

my @en_named = grep { named($_) } map { $_->{head} } @en;
my @ru_named = grep { named($_) } map { $_->{head} } @ru;
my $directives = grep { is_directive($_) } @en_named;
my $variables = @en_named - $directives;
cmp_ok($directives, '>=', 30, "the English page has $directives directives");
cmp_ok($variables, '>=', 2, "and $variables variables");

for my $h (@en_named) {
    ok($ru{$h}, "docs/ru/directives.md has its section ## $h");
}
my %en_has = map { $_ => 1 } @en_named;
is_deeply([grep { !$en_has{$_} } @ru_named], [],
          'the Russian page documents nothing the English one does not');
is_deeply(\@ru_named, \@en_named, 'in the same order');

# the other sections (the introduction, headers, problem responses) are
# paired by position among themselves: their headings are translated
my @en_other = grep { !named($_->{head}) } @en;
my @ru_other = grep { !named($_->{head}) } @ru;
is(scalar @ru_other, scalar @en_other,
   'as many other sections (introduction, headers, problems)')
    or diag 'English: ', join(', ', map { $_->{head} } @en_other),
            "\nRussian: ", join(', ', map { $_->{head} } @ru_other);

my @pairs = map { [$_, $ru{ $_->{head} }] } grep { named($_->{head}) } @en;
for my $i (0 .. $#en_other) {
    push @pairs, [$en_other[$i], $ru_other[$i]] if $ru_other[$i];
}

for my $p (@pairs) {
    my ($e, $r) = @$p;
    next unless $r;
    my $name = $e->{head} eq '' ? 'introduction' : $e->{head};

    like($r->{body}, qr/\p{Cyrillic}/, "$name: in Russian")
        if $e->{body} =~ /[A-Za-z]/;

    if (is_directive($e->{head})) {
        my $eb = block($e->{body}, 'Syntax', 'Default', 'Context');
        my $rb = block($r->{body}, 'Синтаксис', 'Умолчание', 'Контекст');
        ok($eb->{syntax} && defined $eb->{default} && defined $eb->{context},
           "$name: the English block is read");
        is_deeply($rb->{syntax}, $eb->{syntax}, "$name: Синтаксис is Syntax");
        is(default_code($name, $rb->{default}),
           default_code($name, $eb->{default}), "$name: Умолчание is Default")
            or diag "English: $eb->{default}";
        is($rb->{context}, $eb->{context}, "$name: Контекст is Context");
    }

    is_deeply([fences($r->{body})], [fences($e->{body})],
              "$name: the same code blocks");

    my $rs = spans($r->{body});
    my @lost = grep { !$rs->{$_} } sort keys %{ spans($e->{body}) };
    is_deeply(\@lost, [], "$name: every `code` span of the English is kept")
        or diag map { "  missing: `$_`\n" } @lost;

    my %rl = map { $_ => 1 } links($r->{body});
    my @gone = grep { !$rl{$_} }
               map { m{^(?:[a-z]+:|#)} ? $_ : "../$_" } links($e->{body});
    is_deeply(\@gone, [], "$name: the same links, from docs/ru/")
        or diag map { "  missing: ($_)\n" } @gone;
}

# The anchors GitHub gives a page's headings: lower case, punctuation
# dropped, spaces as "-", a repeated one numbered.
sub anchors {
    my ($text) = @_;
    my (%a, %seen);
    for my $s (sections($text)) {
        my $slug = lc $s->{head};
        $slug =~ s/[^\w\- ]//g;
        $slug =~ tr/ /-/;
        my $n = $seen{$slug}++;
        $a{ $n ? "$slug-$n" : $slug } = 1;
    }
    return \%a;
}

# every relative link of the Russian pages leads to a file of the repository,
# and to a heading of it when it names one
sub links_resolve {
    my ($file, $dir, $text) = @_;
    my @bad;
    for my $l (links($text)) {
        if ($l =~ /^[a-z]+:/) {
            push @bad, $l unless index($en_text, "($l)") >= 0;
            next;
        }
        my ($path, $anchor) = $l =~ /^([^#]*)(?:#(.*))?$/;
        my $target = $path eq '' ? $file : "$dir/$path";
        if (!-e $target) {
            push @bad, $l;
        } elsif (defined $anchor && $target =~ /\.md$/) {
            my $t = $path eq '' ? $text : slurp($target);
            push @bad, $l unless anchors($t)->{$anchor};
        }
    }
    is_deeply(\@bad, [], "$file: its links stay inside the repository")
        or diag map { "  broken: ($_)\n" } @bad;
}
links_resolve('docs/ru/directives.md', 'docs/ru', $ru_text);

# README.ru.md: the two commands and the minimal nginx.conf exactly as
# README.md gives them (t/023-readme.t runs that one)
my $readme = slurp('README.md') or die "README.md: $!";
my $readme_ru = slurp('README.ru.md');
ok(defined $readme_ru, 'README.ru.md exists') or do { done_testing(); exit };

for my $re (qr/^(```sh\nmake demo .*?^```)$/ms,
            qr/^(```nginx\nload_module .*?^```)$/ms) {
    my ($want) = $readme =~ $re;
    my ($got) = $readme_ru =~ $re;
    ok(defined $want, "README.md has the block $re") or next;
    is($got, $want, 'README.ru.md gives it exactly');
}
like($readme, qr/\]\(README\.ru\.md\)/, 'README.md links to README.ru.md');
like($readme_ru, qr{\]\(docs/ru/directives\.md\)},
     'README.ru.md links to docs/ru/directives.md');
links_resolve('README.ru.md', '.', $readme_ru);

done_testing();
